package webhook_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"
)

// receiver is a real HTTP server on loopback that records every request
// and answers as its respond function says. With dedup it is a receiver
// that dedups on Idempotency-Key: a key it has acted on before gets the
// first answer again, without a second effect.
type receiver struct {
	*httptest.Server
	// respond answers the n-th request (from 1) for a key; nil: 200 "ok".
	// It runs with the receiver's lock released.
	respond func(w http.ResponseWriter, r *http.Request, n int)
	dedup   bool

	mu       sync.Mutex
	requests map[string][]seen // by Idempotency-Key
	effects  map[string]int    // acted on, by key
	lookups  map[string]int    // GET /lookup, by key
	inFlight int
	maxIn    int
}

type seen struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	At     time.Time // when it arrived
}

func newReceiver(t *testing.T, respond func(w http.ResponseWriter, r *http.Request, n int)) *receiver {
	t.Helper()
	rc := &receiver{respond: respond, requests: map[string][]seen{}, effects: map[string]int{}, lookups: map[string]int{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.Close)
	return rc
}

// newRefusingReceiver is a receiver that refuses the first request for
// every key, answering it as first does (its effect taken back: the
// receiver did not act), and answers later ones 200 "ok".
func newRefusingReceiver(t *testing.T, first func(w http.ResponseWriter, r *http.Request)) *receiver {
	t.Helper()
	rc := newReceiver(t, nil)
	rc.respond = func(w http.ResponseWriter, r *http.Request, n int) {
		if n > 1 {
			_, _ = io.WriteString(w, "ok")
			return
		}
		rc.undo(r.Header.Get("Idempotency-Key"))
		first(w, r)
	}
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	if r.Method == http.MethodGet && r.URL.Path == "/lookup" {
		// The lookup, by the Idempotency-Key it carries: 200 when the
		// key was acted on, 404 when not.
		rc.mu.Lock()
		rc.lookups[key]++
		n := rc.effects[key]
		rc.mu.Unlock()
		if n == 0 {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"found":true}`)
		return
	}
	rc.mu.Lock()
	rc.requests[key] = append(rc.requests[key], seen{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, At: time.Now()})
	n := len(rc.requests[key])
	dup := rc.dedup && rc.effects[key] > 0
	if !dup {
		rc.effects[key]++
	}
	rc.inFlight++
	rc.maxIn = max(rc.maxIn, rc.inFlight)
	rc.mu.Unlock()
	defer func() {
		rc.mu.Lock()
		rc.inFlight--
		rc.mu.Unlock()
	}()
	if dup {
		w.Header().Set("Idempotent-Replayed", "true")
		_, _ = io.WriteString(w, "ok")
		return
	}
	if rc.respond == nil {
		_, _ = io.WriteString(w, "ok")
		return
	}
	rc.respond(w, r, n)
}

// undo takes back the effect of a request that the receiver refused (a
// 4xx or 5xx answer means it did not act).
func (rc *receiver) undo(key string) {
	rc.mu.Lock()
	rc.effects[key]--
	rc.mu.Unlock()
}

func (rc *receiver) got(key string) []seen {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]seen(nil), rc.requests[key]...)
}

func (rc *receiver) effectsOf(key string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.effects[key]
}

func (rc *receiver) total() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, r := range rc.requests {
		n += len(r)
	}
	return n
}

// hostPort is the receiver's 127.0.0.1:port.
func (rc *receiver) hostPort() string {
	u, _ := url.Parse(rc.URL)
	return u.Host
}

func (rc *receiver) maxInFlight() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.maxIn
}
