package s3_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/s3"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/faultproxy"
	"github.com/fencegate/fencegate/internal/testkit/s3test"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// versitySrv is one versitygw for the package's tests (each test its own
// bucket), started by TestMain.
var versitySrv *s3test.Server

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencegate-s3-")
	if err == nil {
		versitySrv, err = s3test.StartDir(dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "s3 tests: %v\n", err)
		os.Exit(1)
	}
	os.Exit(testdb.RunLeakChecked(m, versitySrv.Stop, func() { _ = os.RemoveAll(dir) }))
}

// newBucket is a fresh bucket for the test on the package's versitygw.
func newBucket(t *testing.T) (*s3test.Server, string) {
	t.Helper()
	return versitySrv, versitySrv.NewBucket(t)
}

// clientFor is a client for endpoint with the test credentials, one
// attempt per call unless optFns say otherwise.
func clientFor(endpoint string, optFns ...func(*awss3.Options)) *awss3.Client {
	return awss3.New(awss3.Options{
		Region: s3test.Region, BaseEndpoint: aws.String(endpoint), UsePathStyle: true,
		Credentials:      credentials.NewStaticCredentialsProvider(s3test.AccessKey, s3test.SecretKey, ""),
		RetryMaxAttempts: 1,
	}, optFns...)
}

// testSecret is the receipt secret of the tests' adapters.
const testSecret = "test-receipt-secret-0123456789abcdef"

func newAdapter(t *testing.T, endpoint, bucket string, optFns ...func(*awss3.Options)) *s3.Adapter {
	t.Helper()
	a, err := s3.New(context.Background(), s3.Config{Bucket: bucket, Client: clientFor(endpoint, optFns...), ReceiptSecrets: []string{testSecret}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newProxy is a faultproxy in front of target (host:port), closed when the
// test ends.
func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	proxy, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return proxy
}

func payload(key, content string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"key": key, "content": content, "content_type": "text/plain", "metadata": map[string]string{"job": "nightly"}})
	return b
}

func request(key string, epoch int64, p json.RawMessage) adapters.Request {
	return adapters.Request{IntentID: epoch, Resource: "nightly-report", Epoch: epoch, Kind: s3.Kind, IdempotencyKey: key, Fence: outbox.FenceExecute, Payload: p, Attempt: 1}
}

func execute(t *testing.T, a *s3.Adapter, req adapters.Request) adapters.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := a.Execute(ctx, req)
	if err != nil {
		t.Fatalf("Execute(epoch %d): %v", req.Epoch, err)
	}
	return out
}

// versitygw enforces conditional writes: the probe passes.
func TestProbeAcceptsAServerThatEnforcesConditions(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	a := newAdapter(t, srv.Endpoint, bucket)
	if err := a.Probe(context.Background()); err != nil {
		t.Fatalf("Probe: %v", err)
	}
}

// A server that accepts If-Match and ignores it (a small fake: the one
// thing here that is not a real server) is refused.
func TestProbeRefusesAServerThatIgnoresConditions(t *testing.T) {
	t.Parallel()
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("ETag", `"abc"`)
		w.WriteHeader(http.StatusOK)
	}))
	defer fake.Close()
	a := newAdapter(t, fake.URL, "reports")
	err := a.Probe(context.Background())
	if !errors.Is(err, s3.ErrConditionsIgnored) {
		t.Fatalf("Probe against a server ignoring conditions: %v, want ErrConditionsIgnored", err)
	}
}

// The article's 33/34 with the object store as the destination: B (34)
// publishes; A's publication (33), delayed past it, arrives and is refused
// at the destination — superseded, naming both epochs — and the object
// keeps B's content.
func TestArticleDelayedOldPublicationIsSuperseded(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	a := newAdapter(t, srv.Endpoint, bucket)
	const key = "reports/2026-12-01.txt"
	if out := execute(t, a, request("report/34", 34, payload(key, "report by B"))); out.Status != outbox.StatusSucceeded {
		t.Fatalf("B: %s", out.Status)
	}
	out := execute(t, a, request("report/33", 33, payload(key, "report by A")))
	if out.Status != outbox.StatusSuperseded {
		t.Fatalf("A's late publication: %s %s, want superseded", out.Status, out.Result)
	}
	var res map[string]any
	_ = json.Unmarshal(out.Result, &res)
	if res["superseded_by_epoch"] != 34.0 || res["rejected_epoch"] != 33.0 {
		t.Errorf("result %s, want both epochs", out.Result)
	}
	body, md, ok := srv.Get(t, bucket, key)
	if !ok || string(body) != "report by B" || md["fencegate-epoch"] != "34" || md["job"] != "nightly" {
		t.Errorf("object %q %v, want B's report with epoch 34 and the payload's metadata", body, md)
	}
}

// Publishers on one key with interleaved epochs, all at once: the object
// ends holding the highest epoch's content; every publication is either
// succeeded or superseded.
func TestConcurrentPublishersEndWithTheHighestEpoch(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	a := newAdapter(t, srv.Endpoint, bucket)
	const key = "reports/contended.txt"
	for round := range 3 {
		epochs := rand.Perm(8)
		var wg sync.WaitGroup
		for _, e := range epochs {
			epoch := int64(round*10 + e + 1)
			wg.Go(func() {
				out := execute(t, a, request(fmt.Sprintf("r%d/e%d", round, epoch), epoch, payload(key, fmt.Sprintf("epoch %d", epoch))))
				if out.Status != outbox.StatusSucceeded && out.Status != outbox.StatusSuperseded {
					t.Errorf("epoch %d: %s", epoch, out.Status)
				}
			})
		}
		wg.Wait()
		want := int64(round*10 + 8)
		body, md, _ := srv.Get(t, bucket, key)
		if string(body) != fmt.Sprintf("epoch %d", want) || md["fencegate-epoch"] != fmt.Sprint(want) {
			t.Fatalf("round %d: object %q (epoch %s), want epoch %d's", round, body, md["fencegate-epoch"], want)
		}
	}
}

// A lost response (the PUT reached the server, its answer did not come
// back) is an unknown outcome; the lookup (HEAD: the object's metadata
// names the key) finds it, and writes the receipt the lost attempt could
// not: after a newer publication replaced the object, the receipt still
// finds it.
func TestLostResponseFoundByLookup(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	proxy := newProxy(t, strings.TrimPrefix(srv.Endpoint, "http://"))
	lossy := newAdapter(t, "http://"+proxy.Addr(), bucket)
	a := newAdapter(t, srv.Endpoint, bucket)
	const key = "reports/lost.txt"
	req := request("report/lost", 5, payload(key, "published, answer lost"))
	dropped := proxy.DropResponseTo("PUT /" + bucket + "/" + key)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := lossy.Execute(ctx, req)
	<-dropped
	if adapters.IsRetryable(err) || adapters.IsPermanent(err) || err == nil {
		t.Fatalf("a lost response: %v, want an unknown outcome", err)
	}
	out, found, err := a.Lookup(ctx, req)
	if err != nil || !found || !strings.Contains(string(out.Result), `"found_by":"object"`) {
		t.Fatalf("Lookup: %v %v %s, want found by the object", found, err, out.Result)
	}
	// A newer publication replaces the object: the receipt answers.
	execute(t, a, request("report/newer", 6, payload(key, "newer")))
	out, found, err = a.Lookup(ctx, req)
	if err != nil || !found || !strings.Contains(string(out.Result), `"found_by":"receipt"`) {
		t.Fatalf("Lookup after a newer publication: %v %v %s, want found by the receipt", found, err, out.Result)
	}
	if _, found, _ := a.Lookup(ctx, request("report/never", 7, payload(key, "never"))); found {
		t.Error("a key never published was found")
	}
}

// The same through the runtime: the intent ends succeeded, found by the
// lookup, written once.
func TestRuntimeLostResponseSettledByLookup(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	proxy := newProxy(t, strings.TrimPrefix(srv.Endpoint, "http://"))
	const key = "reports/runtime.txt"
	dropped := proxy.DropResponseTo("PUT /" + bucket + "/" + key)
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Executors: []adapters.Executor{newAdapter(t, "http://"+proxy.Addr(), bucket)},
		Runtime:   executor.Config{LookupSettle: 300 * time.Millisecond, ExecuteTimeout: 5 * time.Second, AckWait: 10 * time.Second},
	})
	id := e.Enqueue(t, e.Intent(s3.Kind, "op-runtime", "report/runtime", payload(key, "once")))
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	<-dropped
	var res s3.Result
	if err := json.Unmarshal(rec.Result, &res); err != nil || res.FoundBy != "object" {
		t.Errorf("result %s, want found by the lookup", rec.Result)
	}
}

// failingFront is an HTTP front to the S3 server at endpoint that, for the
// first n PUTs of path, forwards the PUT (the server stores the object)
// and then answers status with an S3 error instead of the server's
// answer: a server (or a proxy) that fails after the write arrived. It
// counts the PUTs of path.
func failingFront(t *testing.T, endpoint, path string, status int, n int32) (string, *atomic.Int32) {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	var left, puts atomic.Int32
	left.Store(n)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == path {
			puts.Add(1)
			if left.Add(-1) >= 0 {
				rp.ServeHTTP(httptest.NewRecorder(), r)
				w.Header().Set("Content-Type", "application/xml")
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message></Error>`)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &puts
}

// A 5xx (but 503) answering a PUT that the server stored: an unknown
// outcome, which the lookup finds by the object (succeeded, found_by
// object, one PUT), even on the intent's last attempt. It was retryable:
// on the last attempt the intent was failed, effect none, with the object
// in place. A 503 (SlowDown: nothing stored) stays retryable.
func TestFailureAfterTheWriteIsSettledByLookup(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout} {
		srv, bucket := newBucket(t)
		key := fmt.Sprintf("reports/failed-after-write-%d.txt", code)
		front, puts := failingFront(t, srv.Endpoint, "/"+bucket+"/"+key, code, 1)
		e := adaptertest.NewEnv(t, adaptertest.Options{
			Executors: []adapters.Executor{newAdapter(t, front, bucket)},
			Runtime:   executor.Config{MaxAttempts: 1, LookupSettle: 300 * time.Millisecond, ExecuteTimeout: 5 * time.Second, AckWait: 10 * time.Second},
		})
		id := e.Enqueue(t, e.Intent(s3.Kind, fmt.Sprintf("op-%d", code), fmt.Sprintf("report/failed-after-write-%d", code), payload(key, "stored")))
		rec := e.WaitTerminal(t, id)
		var res s3.Result
		_ = json.Unmarshal(rec.Result, &res)
		if rec.Status != outbox.StatusSucceeded || res.FoundBy != "object" || puts.Load() != 1 {
			le := ""
			if rec.LastError != nil {
				le = *rec.LastError
			}
			t.Errorf("%d after the object was stored: %s, effect %s (%s), result %s after %d PUTs; want succeeded, found by the object, after 1",
				code, rec.Status, rec.Effect, le, rec.Result, puts.Load())
		}
	}
	srv, bucket := newBucket(t)
	const key = "reports/slow-down.txt"
	front, _ := failingFront(t, srv.Endpoint, "/"+bucket+"/"+key, http.StatusServiceUnavailable, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// 501 NotImplemented: the server lacks what a header asked (a
	// conditional write); permanent, not an unknown outcome that waits
	// for the settle window at every attempt.
	const nkey = "reports/not-implemented.txt"
	nfront, _ := failingFront(t, srv.Endpoint, "/"+bucket+"/"+nkey, http.StatusNotImplemented, 1)
	if _, err := newAdapter(t, nfront, bucket).Execute(ctx, request("report/not-implemented", 5, payload(nkey, "x"))); !adapters.IsPermanent(err) {
		t.Errorf("501: %v, want permanent", err)
	}
	_, err := newAdapter(t, front, bucket).Execute(ctx, request("report/slow-down", 5, payload(key, "x")))
	var ae *adapters.Error
	if !adapters.IsRetryable(err) || !errors.As(err, &ae) || ae.RetryAfter != 7*time.Second {
		t.Errorf("503 with Retry-After 7: %v, want retryable after 7s (its Retry-After honoured, as adapters.md says)", err)
	}
}

// Bad payloads are refused naming the field.
func TestPayloadRules(t *testing.T) {
	t.Parallel()
	check := outbox.DefaultKinds()[s3.Kind].Check
	for _, tc := range []struct{ payload, field string }{
		{`{"content":"x"}`, "payload.key"},
		{`{"key":"/abs","content":"x"}`, "payload.key"},
		{`{"key":"a/../b","content":"x"}`, "payload.key"},
		{`{"key":"a"}`, "payload.content"},
		{`{"key":"a","content":"x","content_base64":"eA=="}`, "payload.content"},
		{`{"key":"a","content_base64":"!"}`, "payload.content_base64"},
		{`{"key":"a","content":"x","bucket":"Bad_Bucket"}`, "payload.bucket"},
		{`{"key":"a","content":"x","metadata":{"fencegate-epoch":"9"}}`, "payload.metadata.fencegate-epoch"},
		{`{"key":"a","content":"x","metadata":{"Job":"x"}}`, "payload.metadata.Job"},
		{`{"key":"a","content":"x","metadata":{"job":1}}`, "payload.metadata.job"},
		{`{"key":"a","content":"x","acl":"public-read"}`, "payload.acl"},
	} {
		err := check(json.RawMessage(tc.payload))
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: %v, want an InvalidError naming %s", tc.payload, err, tc.field)
		}
	}
	spec := outbox.DefaultKinds()[s3.Kind]
	if spec.DefaultFence != outbox.FenceExecute {
		t.Errorf("default fence %s, want execute", spec.DefaultFence)
	}
}

// The conformance suite against versitygw.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	adaptertest.Run(t, adaptertest.Harness{
		New: func(t *testing.T) adapters.Executor { return newAdapter(t, srv.Endpoint, bucket) },
		Payload: func(i int) json.RawMessage {
			return payload(fmt.Sprintf("conformance/%d.txt", i), fmt.Sprintf("payload %d", i))
		},
		Effects: func(t *testing.T, req adapters.Request) int {
			var p struct {
				Key string `json:"key"`
			}
			_ = json.Unmarshal(req.Payload, &p)
			_, md, ok := srv.Get(t, bucket, p.Key)
			if ok && md["fencegate-idempotency-key"] != "" {
				if k, _ := url.QueryUnescape(md["fencegate-idempotency-key"]); k == req.IdempotencyKey {
					return 1
				}
			}
			return 0
		},
		HasLookup: true,
	})
}
