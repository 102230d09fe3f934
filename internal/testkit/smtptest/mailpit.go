package smtptest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// MailpitModule is the Mailpit version built when no binary is found.
const MailpitModule = "github.com/axllent/mailpit@v1.33.1"

var (
	mailpitOnce sync.Once
	mailpitPath string
	mailpitErr  error
)

// MailpitBinary returns the path of a mailpit binary: $MAILPIT_BIN, else
// mailpit on $PATH, else $(go env GOBIN) or $(go env GOPATH)/bin; when none
// exists it builds one with
//
//	GOFLAGS=-mod=mod go install github.com/axllent/mailpit@v1.33.1
//
// (a couple of minutes on a cold module cache). The answer is cached for the
// life of the process.
func MailpitBinary() (string, error) {
	mailpitOnce.Do(func() { mailpitPath, mailpitErr = findOrBuildMailpit() })
	return mailpitPath, mailpitErr
}

func findOrBuildMailpit() (string, error) {
	return toolbin.Find("MAILPIT_BIN", "mailpit", MailpitModule)
}

// Mailpit is a running Mailpit process with its own database.
type Mailpit struct {
	// SMTPAddr is Mailpit's SMTP host:port.
	SMTPAddr string
	// BaseURL is the HTTP API's base URL, e.g. "http://127.0.0.1:41234".
	BaseURL string

	proc *toolbin.Process
}

// StartMailpit starts Mailpit on free 127.0.0.1 ports with a database in a
// temporary directory, waits until its API and SMTP port answer, and stops
// it when the test ends. The test fails (it does not skip) when Mailpit
// cannot be found, built or started. args are extra Mailpit flags, e.g.
// "--max", "0" to keep every message (Mailpit prunes past 500 by default).
func StartMailpit(t testing.TB, args ...string) *Mailpit {
	t.Helper()
	bin, err := MailpitBinary()
	if err != nil {
		t.Fatalf("smtptest: mailpit is required: %v", err)
	}
	dir := t.TempDir()
	// The free ports are picked by binding and releasing them, so another
	// process may take one before Mailpit binds it: retry a few times.
	var lastErr error
	for attempt := range 3 {
		m, err := startMailpit(bin, filepath.Join(dir, fmt.Sprintf("mailpit-%d.db", attempt)), args)
		if err == nil {
			t.Cleanup(m.Stop)
			return m
		}
		lastErr = err
	}
	t.Fatalf("smtptest: start mailpit: %v", lastErr)
	return nil
}

func startMailpit(bin, db string, extra []string) (*Mailpit, error) {
	smtpPort, err := toolbin.FreePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := toolbin.FreePort()
	if err != nil {
		return nil, err
	}
	m := &Mailpit{
		SMTPAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(smtpPort)),
		BaseURL:  "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
	}
	m.proc, err = toolbin.Start(exec.Command(bin, append([]string{
		"--disable-version-check",
		"--smtp", m.SMTPAddr,
		"--listen", strings.TrimPrefix(m.BaseURL, "http://"),
		"--database", db,
		"--smtp-disable-rdns",
		"--quiet",
	}, extra...)...))
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if err := m.proc.WaitReady("mailpit", 15*time.Second, func() bool { return m.ready(client) }); err != nil {
		m.Stop()
		return nil, fmt.Errorf("%w; mailpit output:\n%s", err, m.proc.Output)
	}
	return m, nil
}

func (m *Mailpit) ready(client *http.Client) bool {
	resp, err := client.Get(m.BaseURL + "/api/v1/info")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	return toolbin.Answers(m.SMTPAddr, time.Second)
}

// Stop terminates the process (SIGTERM, then SIGKILL after 5 s) and waits
// for it.
func (m *Mailpit) Stop() { m.proc.Stop() }

// CountMessageID counts the messages at this Mailpit whose Message-ID is
// exactly messageID (angle brackets optional).
func (m *Mailpit) CountMessageID(ctx context.Context, messageID string) (int, error) {
	return CountMessageID(ctx, m.BaseURL, messageID)
}

// MailpitSummary is a message as Mailpit's search lists it (the fields
// tests use).
type MailpitSummary struct {
	ID        string    `json:"ID"`
	MessageID string    `json:"MessageID"`
	Subject   string    `json:"Subject"`
	Created   time.Time `json:"Created"`
}

// SearchMessageID returns every message Mailpit's search
// `message-id:"<id>"` lists. Mailpit matches substrings, so the list may
// hold messages whose Message-ID merely contains messageID.
func SearchMessageID(ctx context.Context, baseURL, messageID string) ([]MailpitSummary, error) {
	bare := trimID(messageID)
	var all []MailpitSummary
	const limit = 200
	for start := 0; ; start += limit {
		q := url.Values{
			"query": {`message-id:"` + bare + `"`},
			"start": {strconv.Itoa(start)},
			"limit": {strconv.Itoa(limit)},
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+"/api/v1/search?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		resp, err := searchClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("mailpit search: %w", err)
		}
		var page struct {
			MessagesCount int              `json:"messages_count"`
			Messages      []MailpitSummary `json:"messages"`
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		_ = resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("mailpit search: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("mailpit search: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, fmt.Errorf("mailpit search: decode: %w", err)
		}
		all = append(all, page.Messages...)
		if len(page.Messages) == 0 || start+limit >= page.MessagesCount {
			return all, nil
		}
	}
}

// CountMessageID counts the messages at the Mailpit at baseURL whose
// Message-ID is exactly messageID (angle brackets optional; Mailpit stores
// the id without them). For end-to-end tests that assert "sent once".
func CountMessageID(ctx context.Context, baseURL, messageID string) (int, error) {
	list, err := SearchMessageID(ctx, baseURL, messageID)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range list {
		if trimID(m.MessageID) == trimID(messageID) {
			n++
		}
	}
	return n, nil
}

// searchClient keeps no idle connections, so that tests checking for
// leaked goroutines stay clean.
var searchClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}
