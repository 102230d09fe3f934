package smtptest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"syscall"
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

	cmd    *exec.Cmd
	exited chan struct{}
	logs   *bytes.Buffer
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
	smtpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	m := &Mailpit{
		SMTPAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(smtpPort)),
		BaseURL:  "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		exited:   make(chan struct{}),
		logs:     &bytes.Buffer{},
	}
	m.cmd = exec.Command(bin, append([]string{
		"--disable-version-check",
		"--smtp", m.SMTPAddr,
		"--listen", strings.TrimPrefix(m.BaseURL, "http://"),
		"--database", db,
		"--smtp-disable-rdns",
		"--quiet",
	}, extra...)...)
	m.cmd.Stdout = &syncWriter{w: m.logs}
	m.cmd.Stderr = m.cmd.Stdout
	toolbin.SetPdeathsig(m.cmd)
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		_ = m.cmd.Wait()
		close(m.exited)
	}()
	if err := m.waitReady(15 * time.Second); err != nil {
		m.Stop()
		return nil, fmt.Errorf("%w; mailpit output:\n%s", err, m.output())
	}
	return m, nil
}

func (m *Mailpit) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		select {
		case <-m.exited:
			return errors.New("mailpit exited before it was ready")
		default:
		}
		if m.ready(client) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mailpit not ready after %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
	c, err := net.DialTimeout("tcp", m.SMTPAddr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// Stop terminates the process (SIGTERM, then SIGKILL after 5 s) and waits
// for it.
func (m *Mailpit) Stop() {
	select {
	case <-m.exited:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(5 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
}

func (m *Mailpit) output() string {
	w := m.cmd.Stdout.(*syncWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return m.logs.String()
}

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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// searchClient keeps no idle connections, so that tests checking for
// leaked goroutines stay clean.
var searchClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
