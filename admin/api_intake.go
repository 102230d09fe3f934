package admin

import (
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// resourceField is the "resource" every lease and epoch body names; each
// body embeds it, so decodeForResource can check the token's scope.
type resourceField struct {
	Resource string `json:"resource"`
}

func (f resourceField) resourceName() string { return f.Resource }

// decodeForResource decodes a required body into dst strictly (decodeBody)
// and checks that p may act on the resource it names.
func decodeForResource(r *http.Request, p principal, dst interface{ resourceName() string }) error {
	if err := decodeBody(r, dst, false); err != nil {
		return err
	}
	return p.resource(dst.resourceName())
}

func ttl(ms int64) (time.Duration, error) {
	if ms < lease.MinTTL.Milliseconds() || ms > lease.MaxTTL.Milliseconds() {
		return 0, badRequest("ttl_ms", "ttl_ms must be between %d and %d, got %d",
			lease.MinTTL.Milliseconds(), lease.MaxTTL.Milliseconds(), ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// acquireLease: POST /api/v1/leases {"resource","holder","ttl_ms"}.
// 201 with a new epoch, every time: also for the holder that already holds
// the lease (extending a lease and keeping its epoch is renew); 409
// lease_held; 400 naming epoch when the resource's epochs are exhausted;
// 503 busy when the control row stayed locked.
func (s *Server) acquireLease(r *http.Request, p principal) (int, any, error) {
	var req struct {
		resourceField
		Holder string `json:"holder"`
		TTLMs  int64  `json:"ttl_ms"`
	}
	if err := decodeForResource(r, p, &req); err != nil {
		return 0, nil, err
	}
	d, err := ttl(req.TTLMs)
	if err != nil {
		return 0, nil, err
	}
	l, err := s.cfg.Issuer.Acquire(lease.WithPrincipal(r.Context(), p.acting()), req.Resource, req.Holder, d)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, l, nil
}

// renewLease: POST /api/v1/leases/renew {"resource","holder","epoch","ttl_ms"}.
func (s *Server) renewLease(r *http.Request, p principal) (int, any, error) {
	var req struct {
		resourceField
		Holder string `json:"holder"`
		Epoch  int64  `json:"epoch"`
		TTLMs  int64  `json:"ttl_ms"`
	}
	if err := decodeForResource(r, p, &req); err != nil {
		return 0, nil, err
	}
	d, err := ttl(req.TTLMs)
	if err != nil {
		return 0, nil, err
	}
	l, err := s.cfg.Issuer.Renew(r.Context(), req.Resource, req.Holder, req.Epoch, d)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, l, nil
}

// releaseLease: POST /api/v1/leases/release {"resource","holder","epoch"}.
func (s *Server) releaseLease(r *http.Request, p principal) (int, any, error) {
	var req struct {
		resourceField
		Holder string `json:"holder"`
		Epoch  int64  `json:"epoch"`
	}
	if err := decodeForResource(r, p, &req); err != nil {
		return 0, nil, err
	}
	if err := s.cfg.Issuer.Release(r.Context(), req.Resource, req.Holder, req.Epoch); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, map[string]any{"resource": req.Resource, "holder": req.Holder, "epoch": req.Epoch, "released": true}, nil
}

// advanceEpoch: POST /api/v1/epochs {"resource","epoch"}. 201 when the
// epoch advanced, 200 when it was already that epoch, 409 when lower.
func (s *Server) advanceEpoch(r *http.Request, p principal) (int, any, error) {
	// An advance clears a live holder's lease: only a token that says so
	// (an external lock service's) may.
	if !p.scope.Epochs {
		return 0, nil, forbidden("epochs", "token %q may not advance epochs (a token needs \"epochs\": true for POST /api/v1/epochs)", p.name)
	}
	var req struct {
		resourceField
		Epoch int64 `json:"epoch"`
	}
	if err := decodeForResource(r, p, &req); err != nil {
		return 0, nil, err
	}
	before, err := s.cfg.Issuer.Get(r.Context(), req.Resource)
	if err != nil {
		return 0, nil, err
	}
	res, err := s.cfg.Issuer.Advance(lease.WithPrincipal(r.Context(), p.acting()), req.Resource, req.Epoch)
	if err != nil {
		return 0, nil, err
	}
	advanced := before.Epoch < req.Epoch
	status := http.StatusOK
	if advanced {
		status = http.StatusCreated
	}
	return status, map[string]any{"resource": res.Resource, "epoch": res.Epoch, "advanced": advanced}, nil
}

// enqueueResponse is the answer to an enqueue: the intent as stored and
// whether it existed already.
type enqueueResponse struct {
	outbox.Record
	Duplicate bool `json:"duplicate"`
}

// decodeIntent decodes and validates an enqueue request as
// POST /api/v1/intents does, without touching the database: strict JSON
// (see decodeBody), the operation id from the body or the Idempotency-Key
// header, then the outbox's validation with defaults filled in. An error
// names the field.
func decodeIntent(r *http.Request, c *outbox.Client) (outbox.Intent, error) {
	var in outbox.Intent
	if err := decodeBody(r, &in, false); err != nil {
		return outbox.Intent{}, err
	}
	key, fromHeader, err := idempotencyKeyHeader(r)
	if err != nil {
		return outbox.Intent{}, err
	}
	if fromHeader {
		// Two different ids for one request: whichever were taken, a
		// retry that sends only one of them would be another operation.
		if in.OperationID != "" && in.OperationID != key {
			return outbox.Intent{}, badRequest("operation_id",
				"operation_id %q differs from the Idempotency-Key header %q: give one of them, or both the same", in.OperationID, key)
		}
		fromHeader = in.OperationID == ""
		in.OperationID = key
	}
	// The payload is kept as raw bytes, which encoding/json does not check
	// for UTF-8 (it only repairs strings it decodes), and PostgreSQL's
	// jsonb refuses invalid UTF-8 with an error that would be a 500.
	if !utf8.Valid(in.Payload) {
		return outbox.Intent{}, badRequest("payload", "payload must be valid UTF-8")
	}
	out, err := c.Validate(in)
	var inv *InputError
	if fromHeader && errors.As(err, &inv) && inv.Field == "operation_id" {
		// The id came from the header only: name what the client sent.
		return outbox.Intent{}, badRequest(idempotencyKeyName, "Idempotency-Key: the operation id %s", inv.Message)
	}
	return out, err
}

// idempotencyKeyName is the header that may carry an enqueue's operation
// id (IETF's idempotency-key draft; Stripe's API).
const idempotencyKeyName = "Idempotency-Key"

// idempotencyKeyHeader returns the Idempotency-Key header's value and
// whether the request has one. The draft writes the value as a
// Structured Field string ("…"), which is unquoted; any other value is
// taken as it is (Stripe's keys). An empty value, a malformed string or
// the header given twice is an error naming the header.
func idempotencyKeyHeader(r *http.Request) (string, bool, error) {
	vals := r.Header.Values(idempotencyKeyName)
	switch {
	case len(vals) == 0:
		return "", false, nil
	case len(vals) > 1:
		return "", true, badRequest(idempotencyKeyName, "give the Idempotency-Key header once, got %d", len(vals))
	}
	v := strings.TrimSpace(vals[0])
	if v == "" {
		return "", true, badRequest(idempotencyKeyName, "the Idempotency-Key header is empty")
	}
	if !strings.HasPrefix(v, `"`) {
		return v, true, nil
	}
	key, ok := sfString(v)
	if !ok || key == "" {
		return "", true, badRequest(idempotencyKeyName,
			`the Idempotency-Key header %q starts with '"' but is not a Structured Field string ("printable ASCII", \" and \\ escaped) with something in it`, v)
	}
	return key, true, nil
}

// sfString unquotes an RFC 8941 string: '"', printable ASCII with '"' and
// '\' escaped by '\', '"', nothing after it.
func sfString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v)-1 || v[i] != '"' && v[i] != '\\' {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"', c < 0x20, c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// enqueue: POST /api/v1/intents. 201 new, 200 duplicate (the existing
// intent), 409 stale epoch, 422 operation id reused with other content.
func (s *Server) enqueue(r *http.Request, p principal) (int, any, error) {
	in, err := decodeIntent(r, s.cfg.Outbox)
	if err != nil {
		return 0, nil, err
	}
	// The scope before anything is stored.
	if err := p.resource(in.Resource); err != nil {
		return 0, nil, err
	}
	if err := p.kind(in.Kind); err != nil {
		return 0, nil, err
	}
	// Who asked, recorded on the intent in its enqueue's transaction.
	res, err := s.cfg.Outbox.Enqueue(outbox.WithPrincipal(r.Context(), p.acting()), in)
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusCreated
	if res.Duplicate {
		status = http.StatusOK
	}
	rec, err := s.cfg.Outbox.Get(r.Context(), res.IntentID)
	if err != nil || rec == nil {
		if errors.Is(err, outbox.ErrNotFound) {
			err = nil
		}
		// The enqueue committed; answering with less beats an error that
		// would make the worker think it did not.
		s.cfg.Logger.Warn("admin: read back enqueued intent", "intent_id", res.IntentID, "err", err)
		return status, map[string]any{"intent_id": res.IntentID, "status": res.Status, "duplicate": res.Duplicate,
			"resource": in.Resource, "operation_id": in.OperationID, "epoch": in.Epoch}, nil
	}
	rec.Payload = nil // the worker sent it; don't echo up to 256 KiB back
	return status, enqueueResponse{Record: *rec, Duplicate: res.Duplicate}, nil
}
