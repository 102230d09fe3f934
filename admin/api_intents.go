package admin

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// intentID parses the {id} path value; non-numeric → 400 naming intent_id.
func intentID(r *http.Request) (int64, error) {
	raw := r.PathValue("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest("intent_id", "intent id must be a positive integer, got %q", raw)
	}
	return id, nil
}

// MaxWait is the longest GET /api/v1/intents/{id}?wait= waits.
const MaxWait = 60 * time.Second

// listIntents: GET /api/v1/intents?resource=&status=&kind=&limit=&cursor=.
func (s *Server) listIntents(r *http.Request, p principal) (int, any, error) {
	q := r.URL.Query()
	for name := range q {
		switch name {
		case "resource", "status", "kind", "limit", "cursor":
		default:
			return 0, nil, badRequest(name, "unknown query parameter %q", name)
		}
	}
	f, err := operator.ParseListFilter(q.Get("resource"), q.Get("status"), q.Get("kind"), q.Get("limit"), q.Get("cursor"))
	if err != nil {
		return 0, nil, err
	}
	if !p.scope.allResources() {
		// A scoped token lists one resource of its scope at a time.
		if q.Get("resource") == "" {
			return 0, nil, forbidden("resource", "token %q is scoped to resources %s: give resource=", p.name, strings.Join(p.scope.Resources, ", "))
		}
		if err := p.resource(q.Get("resource")); err != nil {
			return 0, nil, err
		}
	}
	page, err := s.op.List(r.Context(), f)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, page, nil
}

// getIntent: GET /api/v1/intents/{id}, with history and timeline.
func (s *Server) getIntent(r *http.Request, p principal) (int, any, error) {
	id, err := intentID(r)
	if err != nil {
		return 0, nil, err
	}
	for name := range r.URL.Query() {
		if name != "wait" {
			return 0, nil, badRequest(name, "unknown query parameter %q", name)
		}
	}
	var wait time.Duration
	if raw := r.URL.Query().Get("wait"); raw != "" {
		wait, err = time.ParseDuration(raw)
		if err != nil || wait < 0 || wait > MaxWait {
			return 0, nil, badRequest("wait", "wait must be a duration from 0s to %s (e.g. 30s), got %q", MaxWait, raw)
		}
	}
	d, err := s.op.Get(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	if err := p.intentResource(d.Resource); err != nil {
		return 0, nil, err
	}
	if wait > 0 && !d.Status.Terminal() {
		// Long-poll: answered when the intent reaches a final status or
		// the wait ends, woken by the outcome notification.
		wctx, cancel := context.WithTimeout(r.Context(), wait)
		_, err := s.cfg.Outbox.Wait(wctx, id)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil {
			return 0, nil, err
		}
		if d, err = s.op.Get(r.Context(), id); err != nil {
			return 0, nil, err
		}
	}
	return http.StatusOK, d, nil
}

// getResource: GET /api/v1/resources/{id}.
func (s *Server) getResource(r *http.Request, p principal) (int, any, error) {
	if err := p.resource(r.PathValue("id")); err != nil {
		return 0, nil, err
	}
	v, err := s.op.Resource(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, v, nil
}

// getEpochs: GET /api/v1/resources/{id}/epochs?limit= — the resource's
// epoch grants (operator.Epochs), newest first: {"resource","grants"}.
// 404 for a resource with no grants, no control row and no intents.
func (s *Server) getEpochs(r *http.Request, p principal) (int, any, error) {
	res := r.PathValue("id")
	if err := p.resource(res); err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	for name := range q {
		if name != "limit" {
			return 0, nil, badRequest(name, "unknown query parameter %q", name)
		}
	}
	limit := 0
	if raw := q.Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > lease.MaxHistoryLimit {
			return 0, nil, badRequest("limit", "limit must be an integer from 1 to %d, got %q", lease.MaxHistoryLimit, raw)
		}
		limit = n
	}
	grants, err := s.op.Epochs(r.Context(), res, limit)
	if err != nil {
		return 0, nil, err
	}
	if len(grants) == 0 {
		// Tell an unknown resource from one whose epochs predate the
		// history.
		if _, err := s.op.Resource(r.Context(), res); err != nil {
			return 0, nil, err
		}
	}
	return http.StatusOK, map[string]any{"resource": res, "grants": grants}, nil
}

// action: POST /api/v1/intents/{id}/retry|cancel|resolve with an optional
// {"note"} ({"outcome","note"} for resolve, outcome required; retry also
// takes "force": true, to retry an intent whose effect is possible).
func (s *Server) action(a operator.Action) handlerFunc {
	return func(r *http.Request, p principal) (int, any, error) {
		id, err := intentID(r)
		if err != nil {
			return 0, nil, err
		}
		var body struct {
			Outcome outbox.Status `json:"outcome"`
			Note    string        `json:"note"`
			Force   bool          `json:"force"`
		}
		if err := decodeBody(r, &body, a != operator.ActionResolve); err != nil {
			return 0, nil, err
		}
		if a != operator.ActionResolve && body.Outcome != "" {
			return 0, nil, badRequest("outcome", "only resolve takes an outcome")
		}
		if !p.scope.allResources() {
			// The intent's resource never changes: read it without a lock.
			rec, err := s.cfg.Outbox.Get(r.Context(), id)
			if err != nil {
				return 0, nil, err
			}
			if err := p.intentResource(rec.Resource); err != nil {
				return 0, nil, err
			}
		}
		res, err := s.op.Apply(r.Context(), operator.ActionRequest{IntentID: id, Action: a, Actor: p.name, Outcome: body.Outcome, Note: body.Note, Force: body.Force})
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, res, nil
	}
}

// bulk: POST /api/v1/intents/bulk {"action","status","kind","resource",
// "resource_prefix","since","until","outcome","note","force","dry_run"}: 200 with what it matched,
// applied and skipped. A token scoped to resources may not (it would reach
// past its scope by a prefix).
func (s *Server) bulk(r *http.Request, p principal) (int, any, error) {
	if !p.scope.allResources() {
		return 0, nil, forbidden("resource", "token %q is scoped to resources %s: bulk actions need an unscoped operator token", p.name, strings.Join(p.scope.Resources, ", "))
	}
	var req operator.BulkRequest
	if err := decodeBody(r, &req, false); err != nil {
		return 0, nil, err
	}
	req.Actor = p.name
	res, err := s.op.Bulk(r.Context(), req)
	if err != nil {
		return 0, nil, err
	}
	s.cfg.Logger.Info("admin: bulk action", "action", req.Action, "status", req.Status, "dry_run", req.DryRun,
		"matched", res.Matched, "applied", res.Applied, "actor", p.name)
	return http.StatusOK, res, nil
}
