package s3_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencegate/fencegate/adapters"
)

// counter forwards TCP to a target and counts the requests that pass
// toward it whose bytes contain a marker (a request line).
type counter struct {
	ln     net.Listener
	target string
	marker []byte

	mu sync.Mutex
	n  int
	wg sync.WaitGroup
}

func newCounter(t *testing.T, target, marker string) *counter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &counter{ln: ln, target: target, marker: []byte(marker)}
	var conns []net.Conn
	var connsMu sync.Mutex
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, in, out)
			connsMu.Unlock()
			c.wg.Add(2)
			go func() {
				defer c.wg.Done()
				defer out.Close()
				c.forward(out, in)
			}()
			go func() {
				defer c.wg.Done()
				defer in.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := out.Read(buf)
					if n > 0 {
						if _, werr := in.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		connsMu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		connsMu.Unlock()
		c.wg.Wait()
	})
	return c
}

// forward copies src to dst, counting the marker across reads.
func (c *counter) forward(dst, src net.Conn) {
	var tail []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			window := append(tail, buf[:n]...)
			if k := bytes.Count(window, c.marker); k > 0 {
				c.mu.Lock()
				c.n += k
				c.mu.Unlock()
				window = window[bytes.LastIndex(window, c.marker)+len(c.marker):]
			}
			tail = append([]byte(nil), window[max(0, len(window)-len(c.marker)+1):]...)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (c *counter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// A PUT whose answer is lost after the server took it (the connection
// dropped after the write) is sent once: not again by the AWS SDK's
// retryer, which a client as the SDK makes it by default has (3 attempts,
// connection errors retryable) — the adapter turns it off for every write,
// whatever client it is given — and not by net/http. The outcome is
// unknown: for the runtime's lookup to settle, not hidden behind a second
// PUT whose 412 the adapter would read as "ours already".
func TestPutNotResentWithinAnAttempt(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	const key = "reports/once.txt"
	marker := "PUT /" + bucket + "/" + key
	count := newCounter(t, strings.TrimPrefix(srv.Endpoint, "http://"), marker)
	proxy := newProxy(t, count.ln.Addr().String())
	// The SDK's defaults: no RetryMaxAttempts, the standard retryer.
	a := newAdapter(t, "http://"+proxy.Addr(), bucket, func(o *awss3.Options) { o.RetryMaxAttempts = 0 })
	dropped := proxy.DropResponseTo(marker)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := a.Execute(ctx, request("report/once", 5, payload(key, "published, answer lost")))
	<-dropped
	if !adapters.IsUnknown(err) {
		t.Errorf("a lost answer to the PUT: %v (status %q), want an unknown outcome", err, out.Status)
	}
	if n := count.count(); n != 1 {
		t.Errorf("%d PUTs of the object reached the server, want 1", n)
	}
	t.Logf("%v; %d PUT(s) reached the server", err, count.count())
	if body, _, ok := srv.Get(t, bucket, key); !ok || string(body) != "published, answer lost" {
		t.Errorf("object %q (%v), want the publication in place", body, ok)
	}
}
