package s3_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencegate/fencegate/outbox"
)

// tornFront is a reverse proxy in front of the S3 server (a fake at the
// edge of the world: the server behind it is real) that answers one HEAD
// torn, as versitygw's HeadObject can: it reads the user metadata and then
// the ETag, each by path, so a publication renamed in place between the
// two reads yields the old object's metadata with the new object's ETag.
type tornFront struct {
	mu    sync.Mutex
	stale map[string]string // the user metadata the next HEAD answers with
	torn  int               // HEADs answered torn
}

func newTornFront(t *testing.T, endpoint string) (*tornFront, string) {
	t.Helper()
	target, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	f := &tornFront{}
	p := httputil.NewSingleHostReverseProxy(target)
	director := p.Director
	p.Director = func(r *http.Request) {
		host := r.Host // signed by the client: keep it
		director(r)
		r.Host = host
	}
	p.ModifyResponse = func(res *http.Response) error {
		if res.Request.Method != http.MethodHead || res.StatusCode != http.StatusOK {
			return nil
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.stale == nil {
			return nil
		}
		for h := range res.Header {
			if strings.HasPrefix(strings.ToLower(h), "x-amz-meta-") {
				res.Header.Del(h)
			}
		}
		for k, v := range f.stale {
			res.Header.Set("X-Amz-Meta-"+k, v)
		}
		f.stale = nil
		f.torn++
		return nil
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// tearNext makes the next HEAD answer with md as the object's metadata
// (and the object's current ETag).
func (f *tornFront) tearNext(md map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stale = md
}

// A HEAD torn between an older object's metadata and the newer object's
// ETag (versitygw, a publication landing during the HEAD) must not let an
// older epoch overwrite a newer one: the conditional write on that ETag
// would succeed. The adapter trusts a read only once two in a row agree.
// Seen failing before that (the epoch 27 publication replaced 28's
// object), as TestConcurrentPublishersEndWithTheHighestEpoch did now and
// then under load.
func TestTornHeadDoesNotLetAnOlderEpochWin(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	front, endpoint := newTornFront(t, srv.Endpoint)
	a := newAdapter(t, endpoint, bucket)
	const key = "reports/torn.txt"
	if out := execute(t, a, request("torn/26", 26, payload(key, "epoch 26"))); out.Status != outbox.StatusSucceeded {
		t.Fatalf("epoch 26: %s", out.Status)
	}
	h, err := clientFor(srv.Endpoint).HeadObject(context.Background(), &awss3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	old := h.Metadata
	if out := execute(t, a, request("torn/28", 28, payload(key, "epoch 28"))); out.Status != outbox.StatusSucceeded {
		t.Fatalf("epoch 28: %s", out.Status)
	}
	front.tearNext(old)
	out := execute(t, a, request("torn/27", 27, payload(key, "epoch 27")))
	if front.torn != 1 {
		t.Fatalf("%d HEADs answered torn, want 1: the test did not reach the path it guards", front.torn)
	}
	if out.Status != outbox.StatusSuperseded {
		t.Errorf("epoch 27 after a torn HEAD: %s %s, want superseded", out.Status, out.Result)
	}
	body, md, _ := srv.Get(t, bucket, key)
	if string(body) != "epoch 28" || md["fencegate-epoch"] != "28" {
		t.Fatalf("object %q (epoch %s), want epoch 28's", body, md["fencegate-epoch"])
	}
}
