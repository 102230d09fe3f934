package admin

import (
	"net/http"
	"strconv"

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

// listIntents: GET /api/v1/intents?resource=&status=&kind=&limit=&cursor=.
func (s *Server) listIntents(r *http.Request, _ principal) (int, any, error) {
	q := r.URL.Query()
	for name := range q {
		switch name {
		case "resource", "status", "kind", "limit", "cursor":
		default:
			return 0, nil, badRequest(name, "unknown query parameter %q", name)
		}
	}
	f, err := ParseListFilter(q.Get("resource"), q.Get("status"), q.Get("kind"), q.Get("limit"), q.Get("cursor"))
	if err != nil {
		return 0, nil, err
	}
	page, err := ListIntents(r.Context(), s.cfg.Pool, f)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, page, nil
}

// getIntent: GET /api/v1/intents/{id}, with history and timeline.
func (s *Server) getIntent(r *http.Request, _ principal) (int, any, error) {
	id, err := intentID(r)
	if err != nil {
		return 0, nil, err
	}
	d, err := GetIntent(r.Context(), s.cfg.Pool, id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, d, nil
}

// getResource: GET /api/v1/resources/{id}.
func (s *Server) getResource(r *http.Request, _ principal) (int, any, error) {
	v, err := GetResource(r.Context(), s.cfg.Pool, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, v, nil
}

// action: POST /api/v1/intents/{id}/retry|cancel|resolve with an optional
// {"note"} ({"outcome","note"} for resolve, outcome required).
func (s *Server) action(a Action) handlerFunc {
	return func(r *http.Request, p principal) (int, any, error) {
		id, err := intentID(r)
		if err != nil {
			return 0, nil, err
		}
		var body struct {
			Outcome outbox.Status `json:"outcome"`
			Note    string        `json:"note"`
		}
		if err := decodeBody(r, &body, a != ActionResolve); err != nil {
			return 0, nil, err
		}
		if a != ActionResolve && body.Outcome != "" {
			return 0, nil, badRequest("outcome", "only resolve takes an outcome")
		}
		res, err := Apply(r.Context(), s.cfg.Pool, ActionRequest{IntentID: id, Action: a, Actor: p.name, Outcome: body.Outcome, Note: body.Note})
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, res, nil
	}
}
