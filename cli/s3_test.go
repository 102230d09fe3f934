package cli

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/s3test"
)

// `gateway run --adapters s3` against a real S3-compatible server
// (versitygw): the bucket is probed, an intent enqueued with the CLI is
// published with its epoch in the object's metadata, and a bad payload is
// exit 2 naming the field.
func TestRunS3(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	srv := s3test.Start(t)
	bucket := srv.NewBucket(t)
	p := e.run(t, s3test.Env(), "--adapters", "s3", "--s3-endpoint", srv.Endpoint, "--s3-bucket", bucket, "--poll-interval", "200ms")

	acquireLease(t, e.db, "report")
	bad := gw(t, e.db, "enqueue", "--resource", "report", "--epoch", "1", "--op", "bad", "--kind", "s3", "--payload", `{"key":"../x","content":"a"}`)
	expectInvalid(t, bad, "payload.key")
	id := enqueue(t, e.db, "--resource", "report", "--epoch", "1", "--op", "publish-1", "--kind", "s3",
		"--payload", `{"key":"reports/2026-12-01.txt","content":"report by A","content_type":"text/plain"}`)
	res := resultOf(t, waitStatus(t, e.db, id, "succeeded"))
	if res["bucket"] != bucket || res["key"] != "reports/2026-12-01.txt" || res["epoch"] != 1.0 {
		t.Fatalf("result %v", res)
	}
	body, md, ok := srv.Get(t, bucket, "reports/2026-12-01.txt")
	if !ok || string(body) != "report by A" || md["fencegate-epoch"] != "1" || md["fencegate-resource"] != "report" {
		t.Fatalf("object %q %v", body, md)
	}
	p.stop(t)
}

// A server that accepts conditional writes and ignores them would turn the
// fence off: gateway run refuses to start (exit 2 naming s3_endpoint). A
// small fake stands for such a server.
func TestRunS3RefusesAServerThatIgnoresConditions(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("ETag", `"abc"`)
	}))
	defer fake.Close()
	p := e.run(t, s3test.Env(), "--adapters", "s3", "--s3-endpoint", fake.URL, "--s3-bucket", "reports")
	if code := p.wait(t, 30*time.Second); code != 2 {
		t.Fatalf("exit %d, want 2:\n%s", code, p.stderr.String())
	}
	if out := p.stderr.String(); !strings.Contains(out, "--s3-endpoint") || !strings.Contains(out, "ignores conditional writes") {
		t.Fatalf("stderr %s, want an error naming --s3-endpoint", out)
	}
}

// A bucket that cannot be probed (nothing listens at the endpoint) stops
// the start, exit 1, saying so once: the message said "s3: s3: s3: probe
// bucket …" (the gateway, the CLI and the adapter each named the kind).
func TestRunS3ProbeFailureSaysS3Once(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	down := httptest.NewServer(http.NotFoundHandler())
	endpoint := down.URL
	down.Close() // nothing listens there now
	p := e.run(t, s3test.Env(), "--adapters", "s3", "--s3-endpoint", endpoint, "--s3-bucket", "reports")
	if code := p.wait(t, 30*time.Second); code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, p.stderr.String())
	}
	if out := p.stderr.String(); !strings.Contains(out, "gateway: s3: probe bucket") || strings.Contains(out, "s3: s3:") {
		t.Fatalf("stderr %s, want one \"s3: probe bucket\"", out)
	}
}
