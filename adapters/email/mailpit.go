package email

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fenceerr"
)

// MailpitLookup finds messages through Mailpit's HTTP API
// (GET /api/v1/search?query=message-id:"…").
//
// Mailpit's message-id: search is a case-insensitive substring match, and
// Mailpit stores the id without angle brackets, so every hit is compared
// exactly against the wanted id; a message whose id merely contains it is
// not a match. Mailpit prunes old messages (--max, default 500), so a
// message may be gone by the time it is looked up.
type MailpitLookup struct {
	// BaseURL is Mailpit's web root, e.g. "http://127.0.0.1:8025".
	BaseURL string
	// Client is the HTTP client. Default: one with a 10 s timeout.
	Client *http.Client
}

var _ Lookup = (*MailpitLookup)(nil)

// check checks BaseURL: an http:// or https:// URL with a host and
// neither a query nor a fragment (the lookup appends its own path and
// query) (Config.Validate). A refused one is not echoed: its user info
// may hold a password (Mailpit's basic auth).
func (l *MailpitLookup) check() error {
	u, err := url.Parse(l.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.HasSuffix(l.BaseURL, "#") {
		return fenceerr.Invalid("BaseURL", "must be an http:// or https:// URL with a host and no query or fragment, e.g. http://127.0.0.1:8025 (the value is not shown: it may hold a password)")
	}
	return nil
}

var defaultLookupClient = &http.Client{Timeout: 10 * time.Second}

// mailpitPage is the part of Mailpit's search response the lookup reads.
type mailpitPage struct {
	MessagesCount int `json:"messages_count"`
	Messages      []struct {
		ID        string    `json:"ID"`
		MessageID string    `json:"MessageID"`
		Subject   string    `json:"Subject"`
		Created   time.Time `json:"Created"`
	} `json:"messages"`
}

// Find reports whether Mailpit holds a message whose Message-ID is exactly
// messageID. info holds "mailpit_id", "subject" and "received_at".
func (l *MailpitLookup) Find(ctx context.Context, messageID string) (bool, map[string]any, error) {
	if l.BaseURL == "" {
		return false, nil, errors.New("mailpit lookup: BaseURL is not set")
	}
	client := l.Client
	if client == nil {
		client = defaultLookupClient
	}
	bare := strings.Trim(strings.TrimSpace(messageID), "<>")
	if bare == "" {
		return false, nil, errors.New("mailpit lookup: empty Message-ID")
	}
	const limit = 100
	for start := 0; ; start += limit {
		page, err := l.search(ctx, client, bare, start, limit)
		if err != nil {
			return false, nil, err
		}
		for _, m := range page.Messages {
			if strings.Trim(m.MessageID, "<>") == bare {
				return true, map[string]any{
					"mailpit_id":  m.ID,
					"subject":     m.Subject,
					"received_at": m.Created.UTC().Format(time.RFC3339Nano),
				}, nil
			}
		}
		if len(page.Messages) == 0 || start+limit >= page.MessagesCount {
			return false, nil, nil
		}
	}
}

func (l *MailpitLookup) search(ctx context.Context, client *http.Client, bare string, start, limit int) (*mailpitPage, error) {
	q := url.Values{
		// Quoted so that Mailpit's query parser takes it as one term.
		"query": {`message-id:"` + bare + `"`},
		"start": {strconv.Itoa(start)},
		"limit": {strconv.Itoa(limit)},
	}
	u := strings.TrimRight(l.BaseURL, "/") + "/api/v1/search?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("mailpit lookup: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("mailpit lookup: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("mailpit lookup: read response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("mailpit lookup: HTTP %d: %s", resp.StatusCode, truncate(bytes.TrimSpace(body), 200))
	}
	var page mailpitPage
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, fmt.Errorf("mailpit lookup: decode response: %w", err)
	}
	return &page, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
