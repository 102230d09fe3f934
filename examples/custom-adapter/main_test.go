package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { adaptertest.Main(m) }

// receiver is the notification service: a real HTTP server that stores one
// message per Idempotency-Key and counts every POST per key (the effects
// the conformance suite counts: a second POST of a key is an execution the
// runtime should not have made, even if the service absorbs it).
type receiver struct {
	mu    sync.Mutex
	msgs  map[string]json.RawMessage
	posts map[string]int
}

func newReceiver(t *testing.T) (*receiver, string) {
	r := &receiver{msgs: map[string]json.RawMessage{}, posts: map[string]int{}}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, srv.URL
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case req.Method == http.MethodPost && req.URL.Path == "/messages":
		key := req.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, `{"error":"Idempotency-Key required"}`, http.StatusBadRequest)
			return
		}
		r.posts[key]++
		if m, ok := r.msgs[key]; ok {
			_, _ = w.Write(m)
			return
		}
		var p Payload
		if err := json.NewDecoder(req.Body).Decode(&p); err != nil {
			http.Error(w, `{"error":"bad json"}`, http.StatusBadRequest)
			return
		}
		m, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("msg-%d", len(r.msgs)+1), "key": key, "channel": p.Channel})
		r.msgs[key] = m
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(m)
	case req.Method == http.MethodGet && strings.HasPrefix(req.URL.Path, "/messages/"):
		if m, ok := r.msgs[strings.TrimPrefix(req.URL.Path, "/messages/")]; ok {
			_, _ = w.Write(m)
			return
		}
		http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
	default:
		http.Error(w, `{"error":"no such route"}`, http.StatusNotFound)
	}
}

func (r *receiver) postsOf(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.posts[key]
}

// TestConformance runs the adapter conformance suite against the example
// adapter and a real HTTP receiver: executed once through the real
// pipeline, never again on redelivery or for a second intent with the same
// key, conflicting content refused, lookup answered, a crash between the
// effect and its record recovered by lookup.
func TestConformance(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	byTest := map[*testing.T]*receiver{}
	adaptertest.Run(t, adaptertest.Harness{
		New: func(t *testing.T) adapters.Executor {
			r, url := newReceiver(t)
			mu.Lock()
			byTest[t] = r
			mu.Unlock()
			return &Notifier{Endpoint: url}
		},
		Payload: func(i int) json.RawMessage {
			b, _ := json.Marshal(Payload{Channel: "ops", Text: fmt.Sprintf("notification %d", i)})
			return b
		},
		Effects: func(t *testing.T, req adapters.Request) int {
			mu.Lock()
			r := byTest[t]
			mu.Unlock()
			return r.postsOf(req.IdempotencyKey)
		},
		HasLookup: true,
		Kinds:     map[string]outbox.KindSpec{Kind: KindSpec()},
	})
}

// The kind's payload rules reject bad input naming the field.
func TestPayloadValidate(t *testing.T) {
	t.Parallel()
	spec := KindSpec()
	for _, tc := range []struct {
		payload string
		field   string
	}{
		{`{"text": "x"}`, "payload.channel"},
		{`{"channel": "ops"}`, "payload.text"},
		{`{"channel": "ops", "text": "x", "extra": 1}`, "payload.extra"},
		{`{"channel": 5, "text": "x"}`, "payload.channel"},
		{`{"channel": "ops", "text": "x"} {}`, "payload"},
		{`[]`, "payload"},
	} {
		err := spec.Check(json.RawMessage(tc.payload))
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != tc.field {
			t.Errorf("Check(%s) = %v, want a ValidationError naming %s", tc.payload, err, tc.field)
		}
	}
	if err := spec.Check(json.RawMessage(`{"channel": "ops", "text": "x"}`)); err != nil {
		t.Errorf("a valid payload: %v", err)
	}
}

// A service's error answers are classified by what they say about the
// post: 429 and 503 refuse it before processing (retry); any other 5xx may
// come after the post was made, so the outcome is unknown, never "did not
// happen" (a retryable error releases the key, and attempts running out
// would record failed for a post that was made).
func TestErrorAnswersClassified(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]func(error) bool{
		http.StatusTooManyRequests:     adapters.IsRetryable,
		http.StatusServiceUnavailable:  adapters.IsRetryable,
		http.StatusInternalServerError: adapters.IsUnknown,
		http.StatusBadGateway:          adapters.IsUnknown,
		http.StatusGatewayTimeout:      adapters.IsUnknown,
		http.StatusBadRequest:          adapters.IsPermanent,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"x"}`, status)
		}))
		n := &Notifier{Endpoint: srv.URL}
		_, err := n.Execute(context.Background(), adapters.Request{
			IdempotencyKey: "k", Epoch: 1, Payload: json.RawMessage(`{"channel":"ops","text":"x"}`),
		})
		srv.Close()
		if !want(err) {
			t.Errorf("a %d answer: %v, classified otherwise", status, err)
		}
	}
}

// The program end to end: the composition root runs its kind's executor,
// and the intent it enqueues reaches the receiver once.
func TestProgramDelivers(t *testing.T) {
	t.Parallel()
	r, url := newReceiver(t)
	db := adaptertest.NewDatabase(t)
	natsURL := adaptertest.StartNATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, db, adaptertest.Schema(), natsURL, url) }()
	deadline := time.Now().Add(time.Minute)
	for {
		r.mu.Lock()
		n := len(r.posts)
		r.mu.Unlock()
		if n == 1 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the program ended before delivering: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing delivered within a minute")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	for key, n := range r.posts {
		if n != 1 || !strings.HasPrefix(key, "ops-digest/digest-") {
			t.Fatalf("key %q posted %d times, want once under ops-digest/digest-…", key, n)
		}
	}
}
