// Package faultproxy loses responses on purpose, for tests. Proxy is a TCP
// proxy that forwards bytes both ways and, when armed, lets a request
// through to the server but swallows the server's answer and cuts the
// connection — the "lost response" of the fencing article: the server did
// the work, the client never heard. Receiver is an HTTP destination that
// does the same itself: it acts on a request, then vanishes.
package faultproxy

import (
	"bytes"
	"io"
	"net"
	"sync"
)

// Proxy listens on 127.0.0.1 and forwards to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	marker  []byte // when non-nil: drop the answer to the next request containing it
	dropped chan struct{}
	conns   []net.Conn
	wg      sync.WaitGroup
}

// New starts a proxy to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropResponseTo arms the proxy: the next client request whose bytes contain
// marker reaches the server, but the server's answer is swallowed and the
// client's connection closed. The returned channel is closed when that
// happened.
func (p *Proxy) DropResponseTo(marker string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = []byte(marker)
	p.dropped = make(chan struct{})
	return p.dropped
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(client, server)
	}
}

func (p *Proxy) pipe(client, server net.Conn) {
	defer p.wg.Done()
	defer client.Close()
	defer server.Close()
	// armed is set by the client→server side when the marked request passed;
	// the server→client side then swallows the next answer.
	armed := make(chan chan struct{}, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				p.mu.Lock()
				if p.marker != nil && bytes.Contains(buf[:n], p.marker) {
					armed <- p.dropped
					p.marker = nil
				}
				p.mu.Unlock()
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = server.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			select {
			case done := <-armed:
				// The server has answered, so it has done the work (for a
				// single-statement transaction: committed). Lose the answer.
				_ = client.Close()
				_, _ = io.Copy(io.Discard, server)
				close(done)
				return
			default:
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
