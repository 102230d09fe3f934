package s3_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/s3"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/s3test"
	"github.com/fencegate/fencegate/outbox"
)

// reservedKeys are keys that name the adapter's own .fencegate/ objects
// (receipts, probes), plainly or through the tricks a server, a proxy or a
// case-insensitive backend might undo: percent-encoding (once or twice,
// of any letter, beside an invalid escape), case, trailing dots and
// spaces, backslashes, "." and ".." segments hidden by encoding.
var reservedKeys = []string{
	".fencegate/receipts/x",
	".fencegate",
	".fencegate/probe/0",
	".FENCEGATE/receipts/x",
	".FenceGate/x",
	"%2efencegate/receipts/x",
	"%2Efencegate/receipts/x",
	"%2E%66%65%6E%63%65%67%61%74%65/x",
	"%252efencegate/x",
	"%2efencegate%2freceipts%2fx",
	"%2efencegate/%zz",
	".fencegate./x",
	".fencegate /x",
	`.fencegate\receipts\x`,
	"%2e%2f.fencegate/x",
	"a%2f..%2f.fencegate/x",
	"%2f.fencegate/x",
}

// Keys under .fencegate/ are refused by the kind's rules (the outbox's
// intake: payload.key) — after undoing the tricks above — and a key that
// only looks similar is not.
func TestReservedKeysRefusedAtIntake(t *testing.T) {
	t.Parallel()
	check := outbox.DefaultKinds()[s3.Kind].Check
	refused := 0
	for _, key := range append(reservedKeys, "/.fencegate/x", "./.fencegate/x", "a/../.fencegate/x") {
		err := check(payload(key, "forged"))
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != "payload.key" {
			t.Errorf("key %q: %v, want an InvalidError naming payload.key", key, err)
			continue
		}
		refused++
	}
	for _, key := range []string{"fencegate/x", "a/.fencegate/x", ".fencegatex/y", "reports/.fencegate", "%2efencegatex/y"} {
		if err := check(payload(key, "fine")); err != nil {
			t.Errorf("key %q: %v, want accepted (not under .fencegate/)", key, err)
		}
	}
	t.Logf("%d reserved keys refused", refused)
	if refused == 0 {
		t.Fatal("no key checked")
	}
}

// An intent that reached the outbox another way (SQL, an older intake)
// with a key under .fencegate/ fails at execute, permanently, with nothing
// written.
func TestReservedKeysRefusedAtExecute(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	a := newAdapter(t, srv.Endpoint, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := 0
	for i, key := range reservedKeys {
		// Past the kind's rules, as a payload stored without them.
		raw, _ := json.Marshal(map[string]any{"key": key, "content": "forged"})
		_, err := a.Execute(ctx, request("forge/"+key, int64(i+1), raw))
		if !adapters.IsPermanent(err) {
			t.Errorf("key %q: %v, want a permanent error", key, err)
		}
		if _, _, ok := srv.Get(t, bucket, key); ok {
			t.Errorf("key %q: the object was written", key)
		}
		n++
	}
	t.Logf("%d reserved keys refused at execute", n)
}

// receiptKeyOf is where the adapter keeps the receipt of key's
// publication under idemKey (its documented layout).
func receiptKeyOf(bucket, key, idemKey string) string {
	o := sha256.Sum256([]byte(bucket + "/" + key))
	k := sha256.Sum256([]byte(idemKey))
	return s3.DefaultReceiptPrefix + hex.EncodeToString(o[:]) + "/" + hex.EncodeToString(k[:])
}

// putRaw writes an object straight to the server, as anyone able to write
// the bucket can.
func putRaw(t *testing.T, endpoint, bucket, key string, body []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := clientFor(endpoint).PutObject(ctx, &awss3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body)}); err != nil {
		t.Fatalf("put s3://%s/%s: %v", bucket, key, err)
	}
}

// forgedReceipt is a receipt as the adapter wrote them before they were
// authenticated — and as anyone able to write the bucket can write one:
// the result JSON alone, matching the payload's SHA-256.
func forgedReceipt(bucket, key, content string) []byte {
	sum := sha256.Sum256([]byte(content))
	b, _ := json.Marshal(s3.Result{Bucket: bucket, Key: key, ETag: `"forged"`, Epoch: 1, SHA256: hex.EncodeToString(sum[:]), Size: len(content)})
	return b
}

// A receipt without a valid MAC — forged by a bucket writer, or written
// before receipts were authenticated — is not proof that the publication
// happened: the lookup never answers succeeded on it. Since it may be a
// real one (the object may have been written), it is not "nothing found"
// either: the answer is unknown, held for an operator.
func TestUnauthenticatedReceiptIsNotProof(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	for name, a := range map[string]*s3.Adapter{
		"with a secret":    newAdapter(t, srv.Endpoint, bucket),
		"without a secret": newAdapterNoSecret(t, srv.Endpoint, bucket),
	} {
		key := "reports/forged-" + strings.ReplaceAll(name, " ", "-") + ".txt"
		req := request("report/forged/"+name, 1, payload(key, "never published"))
		putRaw(t, srv.Endpoint, bucket, receiptKeyOf(bucket, key, req.IdempotencyKey), forgedReceipt(bucket, key, "never published"))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, found, err := a.Lookup(ctx, req)
		cancel()
		if err != nil || !found || out.Status != outbox.StatusUnknown {
			t.Errorf("%s: Lookup on a receipt without a MAC: %v %v %s %s, want found, unknown (held)", name, found, err, out.Status, out.Result)
		}
	}
}

// The same through the runtime: a publication whose PUT never reached the
// server (the connection cut before it was forwarded: an unknown outcome
// to the adapter) with a forged receipt in place ends unknown — held for
// an operator, not succeeded (a lie) and not executed again.
func TestRuntimeForgedReceiptHeld(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	const key = "reports/forged-runtime.txt"
	target, _ := url.Parse(srv.Endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	var puts atomic.Int32
	// The one fake here: a proxy that drops the object's PUT unanswered
	// (the client cannot tell whether it was written) and forwards the
	// rest to versitygw.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == "/"+bucket+"/"+key {
			puts.Add(1)
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = c.Close()
			}
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Executors: []adapters.Executor{newAdapter(t, front.URL, bucket)},
		Runtime:   executor.Config{LookupSettle: 300 * time.Millisecond, ExecuteTimeout: 5 * time.Second, AckWait: 10 * time.Second},
	})
	const idemKey = "report/forged-runtime"
	putRaw(t, srv.Endpoint, bucket, receiptKeyOf(bucket, key, idemKey), forgedReceipt(bucket, key, "never published"))
	id := e.Enqueue(t, e.Intent(s3.Kind, "op-forged", idemKey, payload(key, "never published")))
	rec := e.WaitTerminal(t, id)
	if rec.Status != outbox.StatusUnknown {
		t.Fatalf("intent %s (%s), want unknown: a forged receipt is no proof", rec.Status, rec.Result)
	}
	if n := puts.Load(); n != 1 {
		t.Fatalf("%d PUTs of the object, want 1 (held, not executed again)", n)
	}
	if _, _, ok := srv.Get(t, bucket, key); ok {
		t.Fatal("the object exists")
	}
}

// newAdapterWith is an adapter on endpoint with cfg (its Client made
// here).
func newAdapterWith(t *testing.T, endpoint string, cfg s3.Config) *s3.Adapter {
	t.Helper()
	cfg.Client = clientFor(endpoint)
	a, err := s3.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newAdapterNoSecret is an adapter without a receipt secret.
func newAdapterNoSecret(t *testing.T, endpoint, bucket string) *s3.Adapter {
	t.Helper()
	return newAdapterWith(t, endpoint, s3.Config{Bucket: bucket})
}

// getRaw reads an object straight from the server.
func getRaw(t *testing.T, srv *s3test.Server, bucket, key string) []byte {
	t.Helper()
	b, _, ok := srv.Get(t, bucket, key)
	if !ok {
		t.Fatalf("s3://%s/%s: not found", bucket, key)
	}
	return b
}

func lookup(t *testing.T, a *s3.Adapter, req adapters.Request) (adapters.Outcome, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, found, err := a.Lookup(ctx, req)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return out, found
}

// Receipts are signed: a publication's receipt is found (after a newer
// publication replaced the object) with the secret that signed it, also
// after a rotation (the new secret first, the old one still listed); a
// tampered one, one copied to another publication's place, or one checked
// with another secret only is held, never succeeded; without a secret no
// receipt is written.
func TestReceiptsAreSigned(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	const key = "reports/signed.txt"
	const other = "test-receipt-secret-other-0123456789ab"
	a := newAdapter(t, srv.Endpoint, bucket)
	req := request("report/signed", 5, payload(key, "signed"))
	execute(t, a, req)
	execute(t, a, request("report/signed-newer", 6, payload(key, "newer")))
	rk := receiptKeyOf(bucket, key, req.IdempotencyKey)
	signed := getRaw(t, srv, bucket, rk)
	var r struct {
		V      int             `json:"v"`
		Result json.RawMessage `json:"result"`
		MAC    string          `json:"mac"`
	}
	if err := json.Unmarshal(signed, &r); err != nil || r.V != 2 || len(r.MAC) != 64 {
		t.Fatalf("receipt %s, want a signed one", signed)
	}
	if strings.Contains(string(signed), testSecret) {
		t.Fatal("the secret is in the receipt")
	}
	rotated := newAdapterWith(t, srv.Endpoint, s3.Config{Bucket: bucket, ReceiptSecrets: []string{other, testSecret}})
	for name, ad := range map[string]*s3.Adapter{"signer": a, "rotated": rotated} {
		if out, found := lookup(t, ad, req); !found || out.Status != outbox.StatusSucceeded || !strings.Contains(string(out.Result), `"found_by":"receipt"`) {
			t.Errorf("%s: Lookup %v %s %s, want found by the receipt", name, found, out.Status, out.Result)
		}
	}
	held := func(name string, ad *s3.Adapter, req adapters.Request) {
		t.Helper()
		if out, found := lookup(t, ad, req); !found || out.Status != outbox.StatusUnknown {
			t.Errorf("%s: Lookup %v %s %s, want held (unknown)", name, found, out.Status, out.Result)
		}
	}
	held("another secret only", newAdapterWith(t, srv.Endpoint, s3.Config{Bucket: bucket, ReceiptSecrets: []string{other}}), req)
	held("no secret", newAdapterNoSecret(t, srv.Endpoint, bucket), req)

	// Tampered: the result's epoch changed, the MAC kept.
	tampered := []byte(strings.Replace(string(signed), `"epoch":5`, `"epoch":7`, 1))
	if string(tampered) == string(signed) {
		t.Fatalf("receipt %s has no epoch 5", signed)
	}
	putRaw(t, srv.Endpoint, bucket, rk, tampered)
	held("tampered", a, req)
	// Copied to another publication's place (same content, another key).
	copied := request("report/copied", 5, payload(key, "signed"))
	putRaw(t, srv.Endpoint, bucket, receiptKeyOf(bucket, key, copied.IdempotencyKey), signed)
	held("copied", a, copied)

	// Without a secret, no receipt is written.
	n := newAdapterNoSecret(t, srv.Endpoint, bucket)
	unsigned := request("report/unsigned", 8, payload("reports/unsigned.txt", "x"))
	execute(t, n, unsigned)
	if _, _, ok := srv.Get(t, bucket, receiptKeyOf(bucket, "reports/unsigned.txt", unsigned.IdempotencyKey)); ok {
		t.Error("a receipt was written without a secret")
	}
}

// The upgrade path: a receipt from before receipts were signed stands
// where this publication's goes. While the object still names the
// publication, the lookup finds it by the object and replaces the old
// receipt with a signed one; after a newer publication replaced the
// object, that signed receipt answers. (Where the object no longer names
// it, TestUnauthenticatedReceiptIsNotProof: held.)
func TestUnsignedReceiptReplacedWhenTheObjectProvesIt(t *testing.T) {
	t.Parallel()
	srv, bucket := newBucket(t)
	const key = "reports/upgrade.txt"
	a := newAdapter(t, srv.Endpoint, bucket)
	req := request("report/upgrade", 3, payload(key, "published before the upgrade"))
	rk := receiptKeyOf(bucket, key, req.IdempotencyKey)
	// The publication, by an adapter without a secret (no receipt), then
	// the receipt an older version wrote.
	execute(t, newAdapterNoSecret(t, srv.Endpoint, bucket), req)
	putRaw(t, srv.Endpoint, bucket, rk, forgedReceipt(bucket, key, "published before the upgrade"))
	if out, found := lookup(t, a, req); !found || !strings.Contains(string(out.Result), `"found_by":"object"`) {
		t.Fatalf("Lookup: %v %s, want found by the object", found, out.Result)
	}
	if b := getRaw(t, srv, bucket, rk); !strings.Contains(string(b), `"mac"`) {
		t.Fatalf("receipt %s, want the signed one in its place", b)
	}
	execute(t, a, request("report/upgrade-newer", 4, payload(key, "newer")))
	if out, found := lookup(t, a, req); !found || out.Status != outbox.StatusSucceeded || !strings.Contains(string(out.Result), `"found_by":"receipt"`) {
		t.Fatalf("Lookup after a newer publication: %v %s %s, want found by the receipt", found, out.Status, out.Result)
	}
}

// A receipt secret shorter than MinReceiptSecret is refused, naming the
// field and not the secret.
func TestShortReceiptSecretRefused(t *testing.T) {
	t.Parallel()
	const short = "short-s3cret"
	_, err := s3.New(context.Background(), s3.Config{Bucket: "reports", ReceiptSecrets: []string{short}})
	var inv *fenceerr.InvalidError
	if !errors.As(err, &inv) || inv.Field != "ReceiptSecrets" || strings.Contains(err.Error(), short) {
		t.Fatalf("a short secret: %v, want an InvalidError naming ReceiptSecrets without the secret", err)
	}
}

// Config.Validate names each field, reading no AWS configuration; New
// refuses what it refuses.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   s3.Config
		field string
	}{
		{s3.Config{Bucket: "reports"}, ""},
		{s3.Config{Bucket: "Bad_Bucket"}, "Bucket"},
		{s3.Config{Bucket: "reports", Allow: []string{"x"}}, "Allow"},
		{s3.Config{Bucket: "reports", ReceiptSecrets: []string{"short"}}, "ReceiptSecrets"},
		{s3.Config{Bucket: "reports", ReceiptPrefix: "receipts/"}, "ReceiptPrefix"},
		{s3.Config{Bucket: "reports", Endpoint: "127.0.0.1:9000"}, "Endpoint"},
		{s3.Config{Bucket: "reports", Endpoint: "ftp://u:SECRETPW@127.0.0.1:9000"}, "Endpoint"},
		{s3.Config{Bucket: "reports", Endpoint: "http://u:SECRETPW@exa mple.com"}, "Endpoint"},
		// The SDK refuses a query and echoes the endpoint at start, exit 1
		// (its "Custom endpoint `…` was not a valid URI"); user info it
		// ignores (credentials come from the AWS configuration): refused
		// here, named, not echoed.
		{s3.Config{Bucket: "reports", Endpoint: "http://127.0.0.1:9000/?token=SECRETPW"}, "Endpoint"},
		{s3.Config{Bucket: "reports", Endpoint: "http://127.0.0.1:9000?"}, "Endpoint"},
		{s3.Config{Bucket: "reports", Endpoint: "http://ak:SECRETPW@127.0.0.1:9000"}, "Endpoint"},
		{s3.Config{Bucket: "reports", Endpoint: "http://127.0.0.1:9000/#SECRETPW"}, "Endpoint"},
		{s3.Config{Bucket: "reports", Endpoint: "https://s3.example:9000/prefix"}, ""},
		{s3.Config{Bucket: "reports", LookupSettle: -time.Second}, "LookupSettle"},
		{s3.Config{Bucket: "reports", Concurrency: -1}, "Concurrency"},
	} {
		err := tc.cfg.Validate()
		var inv *fenceerr.InvalidError
		if tc.field == "" && err != nil || tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field) {
			t.Errorf("Validate(%+v) = %v, want an InvalidError naming %q", tc.cfg, err, tc.field)
		}
		if err != nil && strings.Contains(err.Error(), "SECRETPW") {
			t.Errorf("Validate's error shows the endpoint's password: %v", err)
		}
		if tc.field != "" {
			if _, err := s3.New(context.Background(), tc.cfg); !errors.As(err, &inv) || inv.Field != tc.field {
				t.Errorf("New(%+v) = %v, want an InvalidError naming %q", tc.cfg, err, tc.field)
			}
		}
	}
}
