// Package hooktest is a webhook destination for the fault tests
// (test/cluster, test/failover): it counts the requests per
// Idempotency-Key, keeps when each arrived, and answers the payloads'
// lookup_url from those counts, so that an adapter whose outcome was lost
// asks whether the request arrived, as it would a real destination.
//
//	POST /hook            a request; 400 without an Idempotency-Key
//	GET  /lookup/{key}    200 when a request with that key arrived, else 404
package hooktest

import (
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// Receiver is a running destination, closed when its test ends.
type Receiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	per   map[string]int
	times []time.Time
}

// New starts a Receiver.
func New(t testing.TB) *Receiver {
	r := &Receiver{per: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hook", func(w http.ResponseWriter, req *http.Request) {
		key := req.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, "no Idempotency-Key", http.StatusBadRequest)
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		r.per[key]++
		r.times = append(r.times, time.Now())
		r.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /lookup/{key}", func(w http.ResponseWriter, req *http.Request) {
		if r.Count(req.PathValue("key")) == 0 {
			http.NotFound(w, req)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the receiver's base URL (http://127.0.0.1:port): requests go to
// URL/hook, lookups to URL/lookup/{key}.
func (r *Receiver) URL() string { return r.srv.URL }

// Count is how many requests arrived with key.
func (r *Receiver) Count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.per[key]
}

// Counts is the requests per key.
func (r *Receiver) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.per)
}

// Keys is how many distinct keys arrived.
func (r *Receiver) Keys() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.per)
}

// Total is how many requests arrived.
func (r *Receiver) Total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.times)
}

// LastAfter reports whether a request arrived after t.
func (r *Receiver) LastAfter(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.times) > 0 && r.times[len(r.times)-1].After(t)
}

// Times are the requests' arrival times, in order.
func (r *Receiver) Times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.times)
}
