package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/s3test"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// testReceiptSecret is the s3 receipts' secret of these tests.
const testReceiptSecret = "s3-receipt-secret-0123456789abcdef-s3cret"

// `gateway run --s3-allow`: the buckets a payload may name are the
// default bucket and the allow-list. The admin intake refuses another
// (400 naming payload.bucket, nothing stored); `gateway enqueue` does too
// with the gateway's environment ($GATEWAY_S3_ALLOW, $GATEWAY_S3_BUCKET);
// one that reached the outbox without those rules fails at execute with
// nothing written. A key under .fencegate/ is refused at the intake.
func TestRunS3AllowList(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	srv := s3test.Start(t)
	def, other, outside := srv.NewBucket(t), srv.NewBucket(t), srv.NewBucket(t)
	admin := freeAddr(t)
	p := e.run(t, append(s3test.Env(), "GATEWAY_S3_RECEIPT_SECRET="+testReceiptSecret),
		"--adapters", "s3", "--s3-endpoint", srv.Endpoint, "--s3-bucket", def, "--s3-allow", other,
		"--admin-addr", admin, "--poll-interval", "200ms")
	acquireLease(t, e.db, "report")
	s3Payload := func(bucket, key string) string {
		b, _ := json.Marshal(map[string]string{"bucket": bucket, "key": key, "content": "report"})
		return string(b)
	}

	// The admin intake knows the allow-list.
	waitAdmin(t, admin)
	post := func(op, payload string) (int, map[string]any) {
		return postJSON(t, "http://"+admin+"/api/v1/intents", "",
			`{"resource":"report","epoch":1,"operation_id":"`+op+`","kind":"s3","payload":`+payload+`}`)
	}
	for op, c := range map[string]struct{ payload, field string }{
		"outside":  {s3Payload(outside, "reports/x.txt"), "payload.bucket"},
		"reserved": {s3Payload(def, ".fencegate/receipts/forged"), "payload.key"},
		"encoded":  {s3Payload(def, "%2eFenceGate/receipts/forged"), "payload.key"},
	} {
		code, m := post(op, c.payload)
		errObj, _ := m["error"].(map[string]any)
		if code != http.StatusBadRequest || errObj["field"] != c.field {
			t.Errorf("intake %s: %d %v; want 400 naming %s", op, code, m, c.field)
		}
	}
	if n := testdb.Int(t, e.pool, `SELECT count(*) FROM fencegate.intents WHERE operation_id IN ('outside', 'reserved', 'encoded')`); n != 0 {
		t.Fatalf("%d intents stored for refused enqueues", n)
	}
	code, m := post("allowed", s3Payload(other, "reports/other.txt"))
	if code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("intake, allowed bucket: %d %v", code, m)
	}
	allowedID := m["intent_id"]

	// gateway enqueue with the gateway's environment: the allow-list, or
	// only the default bucket when no allow-list is given.
	for _, env := range [][]string{
		{"GATEWAY_S3_ALLOW=" + other, "GATEWAY_S3_BUCKET=" + def},
		{"GATEWAY_S3_BUCKET=" + def},
		{"GATEWAY_S3_ALLOW=" + other},
	} {
		r := gwEnv(t, env, e.db, "enqueue", "--resource", "report", "--epoch", "1", "--op", "cli-outside", "--kind", "s3", "--payload", s3Payload(outside, "reports/x.txt"))
		expectInvalid(t, r, "payload.bucket")
	}
	r := gwEnv(t, []string{"GATEWAY_S3_BUCKET=" + def}, e.db, "enqueue", "--resource", "report", "--epoch", "1", "--op", "cli-other", "--kind", "s3", "--payload", s3Payload(other, "reports/x.txt"))
	expectInvalid(t, r, "payload.bucket")
	expectInvalid(t, gw(t, e.db, "enqueue", "--resource", "report", "--epoch", "1", "--op", "cli-reserved", "--kind", "s3", "--payload", s3Payload(def, ".FENCEGATE/receipts/forged")), "payload.key")

	// Without the environment, gateway enqueue has only the payload's
	// rules: the intent is stored, and fails at execute, nothing written.
	outsideID := enqueue(t, e.db, "--resource", "report", "--epoch", "1", "--op", "stored-outside", "--kind", "s3", "--payload", s3Payload(outside, "reports/x.txt"))
	defID := enqueue(t, e.db, "--resource", "report", "--epoch", "1", "--op", "default", "--kind", "s3", "--payload", `{"key":"reports/default.txt","content":"report"}`)

	st := waitStatus(t, e.db, outsideID, "failed")
	if msg, _ := st["last_error"].(string); !strings.Contains(msg, outside) || !strings.Contains(msg, "s3-allow") {
		t.Errorf("failed intent's error %q, want one naming the bucket and --s3-allow", msg)
	}
	if _, _, ok := srv.Get(t, outside, "reports/x.txt"); ok {
		t.Fatal("an object was written to a bucket outside the allow-list")
	}
	if res := resultOf(t, waitStatus(t, e.db, allowedID, "succeeded")); res["bucket"] != other {
		t.Errorf("allowed bucket: result %v", res)
	}
	if res := resultOf(t, waitStatus(t, e.db, defID, "succeeded")); res["bucket"] != def {
		t.Errorf("default bucket: result %v", res)
	}
	if strings.Contains(p.stderr.String(), testReceiptSecret) {
		t.Fatal("the receipt secret leaked into the log")
	}
	p.stop(t)
}

// Every allowed bucket is probed at start: one that cannot be (it does
// not exist) stops the start, naming it.
func TestRunS3ProbesEveryAllowedBucket(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	srv := s3test.Start(t)
	def := srv.NewBucket(t)
	const missing = "fg-no-such-bucket"
	p := e.run(t, append(s3test.Env(), "GATEWAY_S3_RECEIPT_SECRET="+testReceiptSecret),
		"--adapters", "s3", "--s3-endpoint", srv.Endpoint, "--s3-bucket", def, "--s3-allow", def+","+missing)
	if code := p.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("exit 0 with an allowed bucket that does not exist:\n%s", p.stderr.String())
	}
	if out := p.stderr.String(); !strings.Contains(out, missing) {
		t.Fatalf("stderr %s, want the failing bucket named", out)
	}
}

// The s3 flags' bad values are exit 2 naming the field, without echoing
// the receipt secret.
func TestRunS3BadFlags(t *testing.T) {
	t.Parallel()
	const short = "too-short-s3cret"
	dir := t.TempDir()
	shortFile, empty := filepath.Join(dir, "short"), filepath.Join(dir, "empty")
	if err := os.WriteFile(shortFile, []byte(short+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--adapters", "s3", "--s3-bucket", "reports"}
	runBadFlagCases(t, short, []badFlagCase{
		{"secret file and secret", []string{"GATEWAY_S3_RECEIPT_SECRET=" + testReceiptSecret}, append(base, "--s3-receipt-secret-file", shortFile), "s3_receipt_secret_file"},
		{"secret file missing", nil, append(base, "--s3-receipt-secret-file", filepath.Join(dir, "missing")), "s3_receipt_secret_file"},
		{"secret file empty", nil, append(base, "--s3-receipt-secret-file", empty), "s3_receipt_secret_file"},
		{"secret file holds a short secret", nil, append(base, "--s3-receipt-secret-file", shortFile), "s3_receipt_secret"},
		{"allow entry not a bucket name", nil, []string{"--adapters", "s3", "--s3-bucket", "reports", "--s3-allow", "Bad_Bucket"}, "s3_allow"},
		{"allow from the environment", []string{"GATEWAY_S3_ALLOW=reports,-x"}, []string{"--adapters", "s3", "--s3-bucket", "reports"}, "s3_allow"},
		{"receipt secret too short", []string{"GATEWAY_S3_RECEIPT_SECRET=" + short}, []string{"--adapters", "s3", "--s3-bucket", "reports"}, "s3_receipt_secret"},
	})
}

// --print-config shows the receipt secret only as set.
func TestRunS3ReceiptSecretNotPrinted(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	env := map[string]string{"GATEWAY_S3_RECEIPT_SECRET": testReceiptSecret, "GATEWAY_S3_ALLOW": "a-bucket,b-bucket"}
	a := &app{stdout: &out, stderr: io.Discard, getenv: func(k string) string { return env[k] }}
	if code := cmdRun(context.Background(), a, []string{"--print-config"}); code != exitOK {
		t.Fatalf("gateway run --print-config: exit %d: %s", code, out.String())
	}
	var pc struct{ Config map[string]string }
	if err := json.Unmarshal(out.Bytes(), &pc); err != nil {
		t.Fatal(err)
	}
	if got := pc.Config["s3-receipt-secret"]; got != "(set)" {
		t.Errorf("s3-receipt-secret printed as %q, want (set)", got)
	}
	if got := pc.Config["s3-allow"]; got != "a-bucket,b-bucket" {
		t.Errorf("s3-allow printed as %q", got)
	}
	if strings.Contains(out.String(), testReceiptSecret) {
		t.Fatalf("the secret was printed: %s", out.String())
	}
}

// gateway enqueue takes the kinds' intake rules from the gateway's
// environment; a variable gateway run would refuse ($GATEWAY_S3_ALLOW,
// $GATEWAY_S3_BUCKET, $GATEWAY_WEBHOOK_ALLOW, $GATEWAY_WEBHOOK_HEADER_SECRET)
// is exit 2 naming its flag's field, before connecting, nothing stored —
// never the kind's default rules in its place, which would let any bucket
// or destination through. A header secret's entry is never echoed.
func TestEnqueueRefusesBadIntakeEnv(t *testing.T) {
	t.Parallel()
	db, conn := migratedDB(t)
	acquireLease(t, db, "r")
	const leak = "hs-enq-Q7c2"
	s3Args := []string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "s3", "--kind", "s3", "--payload", `{"key":"a/b","content":"x","bucket":"other-bucket"}`}
	hookArgs := []string{"enqueue", "--resource", "r", "--epoch", "1", "--op", "hook", "--kind", "webhook", "--payload", `{"url":"https://h.example/x"}`}
	cases := []struct {
		env   []string
		args  []string
		field string
	}{
		{[]string{"GATEWAY_S3_ALLOW=b1", "GATEWAY_S3_BUCKET=good-bucket"}, s3Args, "s3_allow"},
		{[]string{"GATEWAY_S3_ALLOW=b1"}, s3Args, "s3_allow"},
		{[]string{"GATEWAY_S3_BUCKET=b0"}, s3Args, "s3_bucket"},
		{[]string{"GATEWAY_S3_ALLOW=b1", "GATEWAY_S3_BUCKET=b0"}, s3Args, "s3_bucket"},
		{[]string{"GATEWAY_WEBHOOK_ALLOW=https://h.example"}, hookArgs, "webhook_allow"},
		{[]string{"GATEWAY_WEBHOOK_HEADER_SECRET=Bearer " + leak}, hookArgs, "webhook_header_secret"},
		{[]string{"GATEWAY_WEBHOOK_ALLOW=h.example", "GATEWAY_WEBHOOK_HEADER_SECRET=a b=/x"}, hookArgs, "webhook_header_secret"},
	}
	checked := 0
	for _, c := range cases {
		for _, url := range []string{db, unreachableDB} {
			r := gwEnv(t, c.env, url, c.args...)
			if r.code != exitBadInput || errorField(r) != c.field {
				t.Errorf("%v: exit %d %s; want exit 2 naming %s", c.env, r.code, r.stdout, c.field)
				continue
			}
			if strings.Contains(r.stdout+r.stderr, leak) {
				t.Fatalf("%v: a header secret's entry is echoed: %s", c.env, r.stdout)
			}
			if msg, _ := r.obj["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "$GATEWAY_") {
				t.Errorf("%v: message %q should name the variable", c.env, msg)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no case checked")
	}
	t.Logf("%d refusals checked (%d environments, with and without a database)", checked, len(cases))
	if n := testdb.Int(t, conn, `SELECT count(*) FROM fencegate.intents`); n != 0 {
		t.Fatalf("%d intents stored by refused enqueues", n)
	}
}
