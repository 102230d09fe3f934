package s3_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/s3"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/outbox"
)

func bucketPayload(bucket, key, content string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"bucket": bucket, "key": key, "content": content})
	return b
}

// The buckets a payload may name are the default one and Config.Allow:
// the intake's rules (the adapter's KindSpec, and IntakeSpec from the
// gateway's settings) refuse another naming payload.bucket; at execute it
// is a permanent failure before any request is sent.
func TestBucketAllowList(t *testing.T) {
	t.Parallel()
	srv, def := newBucket(t)
	other, outside := srv.NewBucket(t), srv.NewBucket(t)
	a := newAdapterWith(t, srv.Endpoint, s3.Config{Bucket: def, Allow: []string{other}, ReceiptSecrets: []string{testSecret}})
	if got := strings.Join(a.Allowed(), ","); got != strings.Join(sortedPair(def, other), ",") {
		t.Fatalf("Allowed() = %s", got)
	}
	defaultOnly, err := s3.IntakeSpec(def, nil)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for name, spec := range map[string]outbox.KindSpec{"adapter": a.Registration().Spec, "intake, default only": defaultOnly} {
		for _, c := range []struct {
			payload json.RawMessage
			ok      bool
		}{
			{payload("reports/a.txt", "x"), true},
			{bucketPayload(def, "reports/a.txt", "x"), true},
			{bucketPayload(other, "reports/a.txt", "x"), name == "adapter"},
			{bucketPayload(outside, "reports/a.txt", "x"), false},
		} {
			err := spec.Check(c.payload)
			var inv *fenceerr.InvalidError
			switch {
			case c.ok && err != nil:
				t.Errorf("%s: %s: %v, want accepted", name, c.payload, err)
			case !c.ok && (!errors.As(err, &inv) || inv.Field != "payload.bucket"):
				t.Errorf("%s: %s: %v, want an InvalidError naming payload.bucket", name, c.payload, err)
			}
			checked++
		}
		if spec.DefaultFence != outbox.FenceExecute {
			t.Errorf("%s: default fence %s", name, spec.DefaultFence)
		}
	}
	t.Logf("%d payloads checked", checked)
	if spec, err := s3.IntakeSpec("", nil); err != nil || spec.Check(bucketPayload(outside, "a", "x")) != nil {
		t.Errorf("IntakeSpec without settings: %v; want the payload's rules only", err)
	}

	// Execute: an allowed bucket is published to; another is refused with
	// nothing sent (the request goes to a server that counts them).
	if out := execute(t, a, request("allowed", 1, bucketPayload(other, "reports/a.txt", "x"))); out.Status != outbox.StatusSucceeded {
		t.Fatalf("allowed bucket: %s %s", out.Status, out.Result)
	}
	var requests atomic.Int32
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(counting.Close)
	c := newAdapterWith(t, counting.URL, s3.Config{Bucket: def, Allow: []string{other}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Execute(ctx, request("outside", 1, bucketPayload(outside, "reports/a.txt", "x")))
	if !adapters.IsPermanent(err) || !errors.Is(err, s3.ErrBucketNotAllowed) || !strings.Contains(err.Error(), outside) {
		t.Fatalf("bucket outside the allow-list: %v, want a permanent ErrBucketNotAllowed naming it", err)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("%d requests sent for a refused bucket", n)
	}
	if _, _, ok := srv.Get(t, outside, "reports/a.txt"); ok {
		t.Fatal("an object was written to a bucket outside the allow-list")
	}
	// An allow-list entry that is not a bucket name is refused.
	_, err = s3.New(context.Background(), s3.Config{Bucket: def, Allow: []string{"Bad_Bucket"}})
	var inv *fenceerr.InvalidError
	if !errors.As(err, &inv) || inv.Field != "Allow" {
		t.Fatalf("a bad allow-list entry: %v, want an InvalidError naming Allow", err)
	}
}

func sortedPair(a, b string) []string {
	if a > b {
		return []string{b, a}
	}
	return []string{a, b}
}

// Probe checks every allowed bucket: one that fails (it does not exist)
// is named.
func TestProbeChecksEveryAllowedBucket(t *testing.T) {
	t.Parallel()
	srv, def := newBucket(t)
	other := srv.NewBucket(t)
	if err := newAdapterWith(t, srv.Endpoint, s3.Config{Bucket: def, Allow: []string{other}}).Probe(context.Background()); err != nil {
		t.Fatalf("Probe of two existing buckets: %v", err)
	}
	const missing = "fg-missing-bucket"
	err := newAdapterWith(t, srv.Endpoint, s3.Config{Bucket: def, Allow: []string{other, missing}}).Probe(context.Background())
	if err == nil || !strings.Contains(err.Error(), `"`+missing+`"`) {
		t.Fatalf("Probe with a missing allowed bucket: %v, want an error naming it", err)
	}
}
