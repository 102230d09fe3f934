package devenv

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/internal/httpserver"
)

// echoMax is how many requests the echo receiver keeps for GET /requests.
const echoMax = 200

// echo is gateway dev's built-in webhook receiver, on loopback: it answers
// every request with what it received, dedups on Idempotency-Key (a key
// seen before gets its first answer again, marked Idempotent-Replayed),
// answers the lookup (GET /lookup, by the Idempotency-Key it carries: 200
// or 404), and lists what it received at GET /requests. It refuses (401)
// a request without a valid signature by the secret dev signs with. The gateway
// allow-lists it and counts it as deduplicating on the key.
type echo struct {
	srv     *http.Server
	ln      net.Listener
	secrets []webhook.Secret // the gateway's signing secret, to verify

	mu       sync.Mutex
	answers  map[string][]byte // by Idempotency-Key
	requests []echoRequest
}

type echoRequest struct {
	At       time.Time `json:"at"`
	Method   string    `json:"method"`
	Path     string    `json:"path"`
	Key      string    `json:"idempotency_key"`
	Resource string    `json:"fencegate_resource"`
	Epoch    string    `json:"fencegate_epoch"`
	IntentID string    `json:"fencegate_intent_id"`
	// Verified: the Standard Webhooks signature checked out.
	Verified bool            `json:"signature_verified"`
	Body     json.RawMessage `json:"body,omitempty"`
	Replayed bool            `json:"replayed"`
}

func startEcho(secret string) (*echo, error) {
	secrets, err := webhook.ParseSecrets("webhook_secret", []string{secret})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e := &echo{ln: ln, secrets: secrets, answers: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /lookup", e.lookup)
	mux.HandleFunc("GET /requests", e.list)
	mux.HandleFunc("/", e.receive)
	e.srv = httpserver.New(mux, nil)
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
}

// Addr is the receiver's 127.0.0.1:port.
func (e *echo) Addr() string { return e.ln.Addr().String() }

// URL is the receiver's base URL.
func (e *echo) URL() string { return "http://" + e.Addr() }

func (e *echo) Close() error { return e.srv.Close() }

// Count is how many requests carried key (replays included).
func (e *echo) Count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, r := range e.requests {
		if r.Key == key {
			n++
		}
	}
	return n
}

func (e *echo) receive(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	key := r.Header.Get("Idempotency-Key")
	rec := echoRequest{At: time.Now().UTC(), Method: r.Method, Path: r.URL.Path, Key: key,
		Resource: r.Header.Get("Fencegate-Resource"), Epoch: r.Header.Get("Fencegate-Epoch"),
		IntentID: r.Header.Get("Fencegate-Intent-Id")}
	if err := webhook.Verify(e.secrets, r.Header, body, time.Now(), 0); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	rec.Verified = true
	if json.Valid(body) {
		rec.Body = body
	}
	e.mu.Lock()
	// Dedup on the key, atomically with recording the effect: a key acted
	// on before gets its first answer, not a second effect.
	answer, dup := e.answers[key]
	if !dup {
		answer, _ = json.Marshal(map[string]any{"received": rec})
		if key != "" {
			e.answers[key] = answer
		}
	}
	rec.Replayed = dup
	e.requests = append(e.requests, rec)
	if len(e.requests) > echoMax {
		e.requests = e.requests[len(e.requests)-echoMax:]
	}
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if dup {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	_, _ = w.Write(answer)
}

func (e *echo) lookup(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	answer, ok := e.answers[r.Header.Get("Idempotency-Key")]
	e.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(answer)
}

func (e *echo) list(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	out, _ := json.MarshalIndent(map[string]any{"requests": e.requests, "count": len(e.requests)}, "", "  ")
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}
