package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/faultproxy"
)

// The webhook receiver's faults, armed by the nemesis (Arm) for a number
// of requests each.
const (
	// HookDropFresh acts on a request that came on a new connection, then
	// closes the connection without answering.
	HookDropFresh = "hook_drop_fresh"
	// HookDropReused is HookDropFresh for a request on a kept-alive
	// connection that already served one: the client cannot tell it from
	// a connection the server closed while idle.
	HookDropReused = "hook_drop_reused"
	// HookLate answers after the sender's execute timeout; it acts before
	// the wait or after it (then the act comes after the sender gave up).
	HookLate = "hook_late"
	// Hook429 refuses with 429 and Retry-After in seconds; not acted on.
	Hook429 = "hook_429"
	// Hook503 refuses with 503 and Retry-After as an HTTP date; not acted
	// on.
	Hook503 = "hook_503"
	// HookReset acts, then resets the connection part-way through the
	// answer: in its status line or in its body.
	HookReset = "hook_reset"
)

// HookFaults are the webhook receiver's fault kinds.
var HookFaults = []string{HookDropFresh, HookDropReused, HookLate, Hook429, Hook503, HookReset}

// Delivery is a webhook request the receiver received: acted on, or
// refused (Refused: a 429 or 503, for the evidence).
type Delivery struct {
	Key      string
	IntentID int64
	Epoch    int64
	Reused   bool   // it came on a kept-alive connection
	Fault    string // the fault applied to its answer, if any
	Refused  bool
	At       time.Time
}

// HookReceiver is the webhook destination of the chaos run: an HTTP server
// on 127.0.0.1 that acts on each POST /hook it does not refuse (records a
// Delivery under its Idempotency-Key: it does not dedup) and answers GET /lookup?key=K with
// 200 when K was acted on, 404 otherwise (a payload's lookup_url). Armed
// faults misbehave on the requests they pick.
type HookReceiver struct {
	// URL is the base URL, http://127.0.0.1:port; Host its host:port.
	URL, Host string
	// late is the sender's execute timeout: a late answer comes after it.
	late time.Duration
	rc   *faultproxy.Receiver
	done chan struct{}
	*faults

	mu         sync.Mutex
	rng        *rand.Rand
	deliveries []Delivery
	requests   int
	lookups    int
	// notBefore is, per key and intent, when the last refusal told the
	// sender to come back (Retry-After); early counts requests of that
	// intent that came sooner.
	notBefore map[hookRetry]time.Time
	early     []string
	pending   int // late answers in progress
}

// hookRetry names a refused request: its key and its intent.
type hookRetry struct {
	key    string
	intent int64
}

// NewHookReceiver starts a receiver whose late answers come after late;
// seed drives its choices. Close stops it.
func NewHookReceiver(seed uint64, late time.Duration) (*HookReceiver, error) {
	h := &HookReceiver{late: late, done: make(chan struct{}), faults: newFaults(),
		rng: rand.New(rand.NewPCG(seed, 0x400c)), notBefore: map[hookRetry]time.Time{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hook", h.hook)
	mux.HandleFunc("GET /lookup", h.lookup)
	rc, err := faultproxy.NewReceiver(mux)
	if err != nil {
		return nil, err
	}
	h.rc, h.URL, h.Host = rc, rc.URL, rc.Host
	return h, nil
}

// Close stops the receiver.
func (h *HookReceiver) Close() {
	select {
	case <-h.done:
	default:
		close(h.done)
	}
	_ = h.rc.Close()
}

// Deliveries returns the requests acted on and those refused (Refused).
func (h *HookReceiver) Deliveries() []Delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Delivery(nil), h.deliveries...)
}

// Stats counts the requests, lookups and retries that came before their
// Retry-After.
func (h *HookReceiver) Stats() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return map[string]int{"hook_requests": h.requests, "hook_lookups": h.lookups, "hook_early_retries": len(h.early)}
}

// EarlyRetries describes the requests that came before the Retry-After
// their key's last refusal gave.
func (h *HookReceiver) EarlyRetries() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.early...)
}

// Wait waits until no late answer is in progress (at most timeout) and
// reports whether none is.
func (h *HookReceiver) Wait(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		h.mu.Lock()
		n := h.pending
		h.mu.Unlock()
		if n == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pick chooses the fault for a request (reused: on a kept-alive
// connection) and counts it as injected.
func (h *HookReceiver) pick(reused bool) string {
	return h.take(HookFaults, func(f string) bool {
		return (f != HookDropFresh || !reused) && (f != HookDropReused || reused)
	})
}

func (h *HookReceiver) hook(w http.ResponseWriter, r *http.Request) {
	// The whole request first: a destination acts on a request it has.
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		return
	}
	reused := faultproxy.Reused(r)
	key := r.Header.Get("Idempotency-Key")
	id, _ := strconv.ParseInt(r.Header.Get("Fencegate-Intent-Id"), 10, 64)
	epoch, _ := strconv.ParseInt(r.Header.Get("Fencegate-Epoch"), 10, 64)
	now := time.Now()

	h.mu.Lock()
	h.requests++
	// Retry-After defers the intent that was refused: another intent with
	// the same key (a worker's own enqueue of it) is not bound by it.
	if nb, ok := h.notBefore[hookRetry{key, id}]; ok {
		// A second of slack: an HTTP date has whole seconds.
		if now.Before(nb.Add(-time.Second)) {
			h.early = append(h.early, fmt.Sprintf("key %s (intent %d) sent again %s before its Retry-After", key, id, nb.Sub(now).Round(time.Millisecond)))
		}
		delete(h.notBefore, hookRetry{key, id})
	}
	fault := h.pick(reused)
	lateAct := fault == HookLate && h.rng.IntN(2) == 0
	hold := h.late + 100*time.Millisecond + time.Duration(h.rng.IntN(1400))*time.Millisecond
	retrySecs := 1 + h.rng.IntN(2)
	cutInStatus := h.rng.IntN(2) == 0
	act := func() {
		h.deliveries = append(h.deliveries, Delivery{Key: key, IntentID: id, Epoch: epoch, Reused: reused, Fault: fault, At: time.Now()})
	}
	switch fault {
	case Hook429, Hook503:
		h.deliveries = append(h.deliveries, Delivery{Key: key, IntentID: id, Epoch: epoch, Reused: reused, Fault: fault, Refused: true, At: now})
	case HookLate:
		h.pending++
		if !lateAct {
			act()
		}
	default:
		act()
	}
	switch fault {
	case Hook429:
		h.notBefore[hookRetry{key, id}] = now.Add(time.Duration(retrySecs) * time.Second)
	case Hook503:
		h.notBefore[hookRetry{key, id}] = now.Add(2 * time.Second).Truncate(time.Second)
	}
	h.mu.Unlock()

	switch fault {
	case Hook429:
		w.Header().Set("Retry-After", strconv.Itoa(retrySecs))
		http.Error(w, "slow down", http.StatusTooManyRequests)
	case Hook503:
		w.Header().Set("Retry-After", now.Add(2*time.Second).UTC().Format(http.TimeFormat))
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	case HookDropFresh, HookDropReused:
		faultproxy.Vanish(w)
	case HookReset:
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		answer := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"ok\":"
		if cutInStatus {
			answer = "HTTP/1.1 2"
		}
		_, _ = conn.Write([]byte(answer))
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close with a reset
		}
		_ = conn.Close()
	case HookLate:
		defer func() { h.mu.Lock(); h.pending--; h.mu.Unlock() }()
		select {
		case <-time.After(hold):
		case <-h.done:
			return
		}
		if lateAct {
			h.mu.Lock()
			act()
			h.mu.Unlock()
		}
		ok(w)
	default:
		ok(w)
	}
}

func ok(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"ok":true}`))
}

func (h *HookReceiver) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	h.mu.Lock()
	h.lookups++
	n := 0
	for _, d := range h.deliveries {
		if d.Key == key && !d.Refused {
			n++
		}
	}
	h.mu.Unlock()
	if n == 0 {
		http.Error(w, "no such request", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"key": key, "acted": n})
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
