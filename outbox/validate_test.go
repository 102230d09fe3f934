package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// Each bad input: an error naming the field, and nothing stored.
func TestBadInputStoresNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Minute)
	small, err := outbox.New(b.pool, outbox.Config{Schema: testdb.Schema(), MaxPayloadBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	email := func(p string) outbox.Intent {
		return outbox.Intent{Resource: "r", Epoch: l.Epoch, OperationID: "op", Kind: "email", Payload: json.RawMessage(p)}
	}
	file := func(p string) outbox.Intent {
		return outbox.Intent{Resource: "r", Epoch: l.Epoch, OperationID: "op", Kind: "file", Payload: json.RawMessage(p)}
	}
	with := func(in outbox.Intent, f func(*outbox.Intent)) outbox.Intent { f(&in); return in }
	good := email(emailPayload)

	cases := []struct {
		name   string
		in     outbox.Intent
		field  string
		client *outbox.Client
	}{
		{"empty resource", with(good, func(i *outbox.Intent) { i.Resource = "" }), "resource", nil},
		{"long resource", with(good, func(i *outbox.Intent) { i.Resource = strings.Repeat("r", 201) }), "resource", nil},
		{"empty operation id", with(good, func(i *outbox.Intent) { i.OperationID = "" }), "operation_id", nil},
		{"NUL in operation id", with(good, func(i *outbox.Intent) { i.OperationID = "a\x00b" }), "operation_id", nil},
		{"epoch zero", with(good, func(i *outbox.Intent) { i.Epoch = 0 }), "epoch", nil},
		{"epoch negative", with(good, func(i *outbox.Intent) { i.Epoch = -3 }), "epoch", nil},
		{"empty kind", with(good, func(i *outbox.Intent) { i.Kind = "" }), "kind", nil},
		{"unknown kind", with(good, func(i *outbox.Intent) { i.Kind = "sms" }), "kind", nil},
		{"bad fence", with(good, func(i *outbox.Intent) { i.Fence = "later" }), "fence", nil},
		{"key too long", with(good, func(i *outbox.Intent) { i.IdempotencyKey = strings.Repeat("k", 256) }), "idempotency_key", nil},
		{"default key too long", with(good, func(i *outbox.Intent) {
			i.Resource = strings.Repeat("r", 150)
			i.OperationID = strings.Repeat("o", 150)
		}), "idempotency_key", nil},
		{"payload missing", email(""), "payload", nil},
		{"payload array", email(`[1,2]`), "payload", nil},
		{"payload string", email(`"hi"`), "payload", nil},
		{"payload null", email(`null`), "payload", nil},
		{"payload not JSON", email(`{"to":`), "payload", nil},
		{"payload two objects", email(emailPayload + emailPayload), "payload", nil},
		{"payload over limit", email(`{"to":"a@example.com","from":"b@example.com","subject":"s","text":"` + strings.Repeat("x", 2000) + `"}`), "payload", small},
		{"payload invalid UTF-8", email("{\"to\":\"a@example.com\",\"from\":\"b@example.com\",\"subject\":\"s\",\"text\":\"\xff\"}"), "payload", nil},
		{"payload lone surrogate", email(`{"to":"a@example.com","from":"b@example.com","subject":"s","text":"\ud800"}`), "payload", nil},
		{"email no to", email(`{"from":"b@example.com","subject":"s","text":"t"}`), "payload.to", nil},
		{"email empty to", email(`{"to":[],"from":"b@example.com","subject":"s","text":"t"}`), "payload.to", nil},
		{"email bad to", email(`{"to":["not-an-address"],"from":"b@example.com","subject":"s","text":"t"}`), "payload.to[0]", nil},
		{"email to number", email(`{"to":42,"from":"b@example.com","subject":"s","text":"t"}`), "payload.to", nil},
		{"email bad cc", email(`{"to":"a@example.com","cc":["x"],"from":"b@example.com","subject":"s","text":"t"}`), "payload.cc[0]", nil},
		{"email bad bcc", email(`{"to":"a@example.com","bcc":"@@","from":"b@example.com","subject":"s","text":"t"}`), "payload.bcc[0]", nil},
		{"email no from", email(`{"to":"a@example.com","subject":"s","text":"t"}`), "payload.from", nil},
		{"email bad from", email(`{"to":"a@example.com","from":"nobody","subject":"s","text":"t"}`), "payload.from", nil},
		{"email no subject", email(`{"to":"a@example.com","from":"b@example.com","text":"t"}`), "payload.subject", nil},
		{"email subject header injection", email(`{"to":"a@example.com","from":"b@example.com","subject":"s\r\nBcc: x@y.z","text":"t"}`), "payload.subject", nil},
		{"email no body", email(`{"to":"a@example.com","from":"b@example.com","subject":"s"}`), "payload.text", nil},
		{"file no target", file(`{"content":"x"}`), "payload.target", nil},
		{"file absolute", file(`{"target":"/etc/passwd","content":"x"}`), "payload.target", nil},
		{"file dotdot", file(`{"target":"a/../../etc/passwd","content":"x"}`), "payload.target", nil},
		{"file leading dotdot", file(`{"target":"../x","content":"x"}`), "payload.target", nil},
		{"file NUL", file(`{"target":"a\u0000b","content":"x"}`), "payload.target", nil},
		{"file trailing slash", file(`{"target":"dir/","content":"x"}`), "payload.target", nil},
		{"file dot segment", file(`{"target":"./x","content":"x"}`), "payload.target", nil},
		{"file no content", file(`{"target":"x"}`), "payload.content", nil},
		{"file both contents", file(`{"target":"x","content":"a","content_base64":"YQ=="}`), "payload.content", nil},
		{"file bad base64", file(`{"target":"x","content_base64":"!!!"}`), "payload.content_base64", nil},
		{"file content not string", file(`{"target":"x","content":5}`), "payload.content", nil},
		// Only the payload's own fields, spelt exactly: a misspelt one
		// would be dropped ("Bcc": the message goes out without it).
		{"email unknown field", email(`{"to":"a@example.com","Bcc":"boss@example.com","from":"b@example.com","subject":"s","text":"t"}`), "payload.Bcc", nil},
		{"email field name case", email(`{"To":"a@example.com","from":"b@example.com","subject":"s","text":"t"}`), "payload.To", nil},
		{"file unknown field", file(`{"target":"x","content":"a","extra":true}`), "payload.extra", nil},
		{"file field name case", file(`{"target":"x","Content":"a"}`), "payload.Content", nil},
	}
	t.Logf("%d bad inputs", len(cases))
	if len(cases) == 0 {
		t.Fatal("no bad input checked")
	}
	for _, tc := range cases {
		c := b.client
		if tc.client != nil {
			c = tc.client
		}
		_, err := c.Enqueue(ctx, tc.in)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, outbox.ErrInvalid) {
			t.Errorf("%s: err = %v; want a ValidationError", tc.name, err)
			continue
		}
		if ve.Field != tc.field {
			t.Errorf("%s: field = %q (%v); want %q", tc.name, ve.Field, err, tc.field)
		}
		tx, _ := b.pool.Begin(ctx)
		_, err = b.client.EnqueueTx(ctx, tx, tc.in)
		_ = tx.Rollback(ctx)
		if tc.client == nil && !errors.Is(err, outbox.ErrInvalid) {
			t.Errorf("%s: EnqueueTx err = %v; want invalid", tc.name, err)
		}
	}
	if n := countIntents(t, b.pool, ""); n != 0 {
		t.Fatalf("intents stored after bad input: %d; want 0", n)
	}

	// The good ones for contrast: accepted.
	for i, in := range []outbox.Intent{
		good,
		email(`{"to":"Alice <alice@example.com>","cc":["c@example.com"],"from":"b@example.com","subject":"s","html":"<p>hi</p>"}`),
		file(`{"target":"reports/2026/12/01.txt","content":""}`),
		file(`{"target":"x.bin","content_base64":"AAEC"}`),
	} {
		in.OperationID = "good-" + string(rune('a'+i))
		if _, err := b.client.Enqueue(ctx, in); err != nil {
			t.Errorf("good input %d rejected: %v", i, err)
		}
	}
}

func TestConfigRejectsBadKinds(t *testing.T) {
	t.Parallel()
	if _, err := outbox.New(nil, outbox.Config{Schema: testdb.Schema(), Kinds: map[string]outbox.KindSpec{"x": {DefaultFence: "sometimes"}}}); err == nil {
		t.Fatal("a kind with a bad default fence was accepted")
	}
	// A kind's name is a token of a NATS subject and consumer name: an
	// intent of kind "a b" could never be published, and held up the
	// relay of every other intent.
	spec := outbox.KindSpec{DefaultFence: outbox.FenceCommit}
	bad := []string{"", "a b", "*", ">", "x.y", "a/b", "é", "tab\t", strings.Repeat("k", outbox.MaxKindLen+1)}
	for _, name := range bad {
		_, err := outbox.New(nil, outbox.Config{Schema: testdb.Schema(), Kinds: map[string]outbox.KindSpec{name: spec}})
		var inv *outbox.ValidationError
		if !errors.As(err, &inv) || inv.Field != "Kinds" {
			t.Errorf("kind name %q: %v, want an error naming Kinds", name, err)
		}
	}
	for _, name := range []string{"notify", "my_kind-2", "SMS", strings.Repeat("k", outbox.MaxKindLen)} {
		if _, err := outbox.New(nil, outbox.Config{Schema: testdb.Schema(), Kinds: map[string]outbox.KindSpec{name: spec}}); err != nil {
			t.Errorf("kind name %q refused: %v", name, err)
		}
	}
	t.Logf("checked %d bad and 4 good kind names", len(bad))
	// An empty map (not nil, which is DefaultKinds()) would refuse every
	// intent: refused, naming Kinds.
	_, err := outbox.New(nil, outbox.Config{Schema: testdb.Schema(), Kinds: map[string]outbox.KindSpec{}})
	if inv := (*outbox.ValidationError)(nil); !errors.As(err, &inv) || inv.Field != "Kinds" {
		t.Errorf("empty Kinds: %v, want an error naming Kinds", err)
	}
	c, err := outbox.New(nil, outbox.Config{Schema: testdb.Schema(), Kinds: map[string]outbox.KindSpec{"noop": {DefaultFence: outbox.FenceCommit}}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := c.Validate(outbox.Intent{Resource: "r", Epoch: 1, OperationID: "o", Kind: "noop", Payload: json.RawMessage(`{}`)})
	if err != nil || in.Fence != outbox.FenceCommit || in.IdempotencyKey != "r/o" {
		t.Fatalf("custom kind: %+v, %v", in, err)
	}
}

// KeyScopeResource: the effective key is "<bytes>:<resource>/<key>"
// (the operation id standing in for no key), normalizing twice changes
// nothing, nested names never collide, and an effective key over the limit
// is refused naming idempotency_key. Under the global scope a key of the
// scoped form is refused. An unknown scope is refused by New.
func TestKeyScopeResource(t *testing.T) {
	t.Parallel()
	c, err := outbox.New(nil, outbox.Config{Schema: testdb.Schema(), KeyScope: outbox.KeyScopeResource})
	if err != nil {
		t.Fatal(err)
	}
	in := outbox.Intent{Resource: "tenant/a", Epoch: 1, OperationID: "op", Kind: "file", Payload: json.RawMessage(`{"target":"x","content":"y"}`)}
	for key, want := range map[string]string{
		"":                       "8:tenant/a/op",
		"k":                      "8:tenant/a/k",
		"8:tenant/a/k":           "8:tenant/a/k",
		"tenant/a/k":             "8:tenant/a/tenant/a/k",
		"tenant/b/k":             "8:tenant/a/tenant/b/k",
		"b/k":                    "8:tenant/a/b/k",
		strings.Repeat("x", 240): "8:tenant/a/" + strings.Repeat("x", 240),
	} {
		in.IdempotencyKey = key
		got, err := c.Validate(in)
		if err != nil || got.IdempotencyKey != want {
			t.Errorf("key %q: %q, %v; want %q", key, got.IdempotencyKey, err, want)
			continue
		}
		if again, err := c.Validate(got); err != nil || again.IdempotencyKey != want {
			t.Errorf("key %q normalized twice: %q, %v", key, again.IdempotencyKey, err)
		}
	}
	// Nested names: tenant/a with key b/k and tenant/a/b with key k are two
	// keys (with "<resource>/<key>" both were "tenant/a/b/k").
	nested, err := c.Validate(outbox.Intent{Resource: "tenant/a/b", Epoch: 1, OperationID: "op", Kind: "file", IdempotencyKey: "k",
		Payload: json.RawMessage(`{"target":"x","content":"y"}`)})
	if err != nil || nested.IdempotencyKey == "8:tenant/a/b/k" {
		t.Errorf("tenant/a/b with key k: %q, %v; must differ from tenant/a with key b/k", nested.IdempotencyKey, err)
	}
	in.IdempotencyKey = strings.Repeat("x", 250)
	var ve *outbox.ValidationError
	if _, err := c.Validate(in); !errors.As(err, &ve) || ve.Field != "idempotency_key" {
		t.Errorf("an effective key over 255 bytes: %v, want an error naming idempotency_key", err)
	}
	if _, err := outbox.New(nil, outbox.Config{Schema: testdb.Schema(), KeyScope: "tenant"}); err == nil {
		t.Error("KeyScope \"tenant\" accepted")
	}
	g, _ := outbox.New(nil, outbox.Config{Schema: testdb.Schema()})
	for _, key := range []string{"k", "2024:invoice/7", "8:tenant/a", "08:tenant/a/k", "+8:tenant/a/k"} {
		in.IdempotencyKey = key
		if got, err := g.Validate(in); err != nil || got.IdempotencyKey != key {
			t.Errorf("the global scope, key %q: %q, %v; want the key as given", key, got.IdempotencyKey, err)
		}
	}
	for _, key := range []string{"8:tenant/a/k", "1:x/", "5:a/b/c/d"} {
		in.IdempotencyKey = key
		if _, err := g.Validate(in); !errors.As(err, &ve) || ve.Field != "idempotency_key" {
			t.Errorf("the global scope, key %q of the scoped form: %v; want it refused naming idempotency_key", key, err)
		}
	}
}
