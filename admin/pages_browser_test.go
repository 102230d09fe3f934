package admin

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// chromiumInstallHint says how to get the browser the page tests drive.
const chromiumInstallHint = "install it with `apt-get update && apt-get install -y chromium` " +
	"(scripts/test.sh does this when run as root), or set CHROMIUM_BIN to a Chromium or Chrome binary"

// chromium returns the browser binary: $CHROMIUM_BIN, else
// /usr/bin/chromium. A missing browser fails the test: the pages are part
// of the product, and a skipped browser test would pass unnoticed.
func chromium(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("CHROMIUM_BIN")
	if bin == "" {
		bin = "/usr/bin/chromium"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Fatalf("headless Chromium is required by the admin pages' browser test and was not found at %q (%v): %s",
			bin, err, chromiumInstallHint)
	}
	return path
}

// browser starts a headless Chromium with an empty profile and returns a
// context for its tab, bounded by timeout; the browser is closed at the
// test's end.
func browser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	// The first call starts the browser, which lives as long as that
	// call's context: no timeout on it, one on the steps instead.
	start := time.Now()
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start Chromium: %v (%s)", err, chromiumInstallHint)
	}
	t.Logf("Chromium started in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(bctx, timeout)
	t.Cleanup(cancel)
	return ctx
}

// A real browser, without JavaScript on the pages: open the list, filter by
// status failed, open the failed intent, press retry with a note, and see
// the page come back with the intent pending and the event in its
// timeline. FENCEGATE_PAGES_SCREENSHOT=path saves a screenshot of it.
func TestPagesInBrowser(t *testing.T) {
	e := setupNoTokens(t)
	bctx := browser(t, 2*time.Minute)
	e.atEpochOne("nightly-report")
	e.seedIntent("", "nightly-report", "2026-11-29", outbox.StatusSucceeded, "")
	e.seedIntent("", "nightly-report", "2026-11-30", outbox.StatusUnknown, "smtp: connection reset after DATA")
	failed := e.seedIntent("", "nightly-report", "2026-12-01", outbox.StatusFailed, "550 5.1.1 mailbox unavailable")
	e.seedIntent("", "nightly-report", "2026-12-02", outbox.StatusPending, "")

	tab := &browserTab{t: t, ctx: bctx}
	step, text, count, location := tab.step, tab.text, tab.count, tab.location

	step("open the list",
		chromedp.Navigate(e.ts.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("intents")),
	)
	if n := count("#intents tbody tr"); n != 4 {
		t.Fatalf("the list shows %d intents, want 4", n)
	}

	step("filter by status failed",
		chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "failed"),
		chromedp.Click(chromedp.ID("apply-filters")),
	)
	// The old page's rows satisfy any wait on rows: wait for the new URL
	// (deadline-bound), then for the new page's rows.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(location(), "status=failed"); {
		if time.Now().After(deadline) {
			t.Fatalf("the filter form did not navigate; still at %s", location())
		}
		time.Sleep(20 * time.Millisecond)
	}
	step("filtered page loaded", chromedp.WaitVisible(chromedp.CSS(`#intents tbody tr`)))
	if loc, n, table := location(), count("#intents tbody tr"), text("#intents tbody"); !strings.Contains(loc, "status=failed") || n != 1 || !strings.Contains(table, "failed") {
		t.Fatalf("filtered list at %s: %d rows: %q", loc, n, table)
	}

	step("open the failed intent",
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#intents a[href="/intents/%d"]`, failed))),
		chromedp.WaitVisible(chromedp.ID("retry")),
	)
	if loc, st, errText := location(), text("#status"), text("#last-error"); !strings.HasSuffix(loc, fmt.Sprintf("/intents/%d", failed)) || st != "failed" || !strings.Contains(errText, "550 5.1.1") {
		t.Fatalf("intent page at %s: status %q, error %q", loc, st, errText)
	}
	if count("#resolve") != 0 {
		t.Fatal("the page offers resolve for a failed intent")
	}

	step("press retry",
		chromedp.SendKeys(chromedp.CSS(`#retry-form textarea[name="note"]`), "mailbox restored by IT"),
		chromedp.Click(chromedp.ID("retry")),
		chromedp.WaitVisible(chromedp.ID("flash")),
	)
	if loc, st, flash := location(), text("#status"), text("#flash"); st != "pending" || !strings.Contains(flash, "Retried") || !strings.HasSuffix(loc, fmt.Sprintf("/intents/%d?done=retry", failed)) {
		t.Fatalf("after retry at %s: status %q, flash %q", loc, st, flash)
	}
	if tl := text("#timeline"); !strings.Contains(tl, "retry") || !strings.Contains(tl, "anonymous") || !strings.Contains(tl, "mailbox restored by IT") {
		t.Fatalf("timeline after retry: %q", tl)
	}
	if count("#retry") != 0 {
		t.Fatal("the page still offers retry for a pending intent")
	}
	if st := e.status(failed); st != outbox.StatusPending {
		t.Fatalf("status in the database = %s, want pending", st)
	}

	if path := os.Getenv("FENCEGATE_PAGES_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			tab.fail("screenshot", err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
}

// browserTab drives one tab: each helper fails the test with the page's
// HTML when a step fails.
type browserTab struct {
	t   *testing.T
	ctx context.Context
}

func (b *browserTab) fail(what string, err error) {
	b.t.Helper()
	html, _ := chromedp.Run(b.ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	b.t.Fatalf("%s: %v\npage:\n%s", what, err, html)
}

func (b *browserTab) step(name string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	start := time.Now()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.fail(name, err)
	}
	b.t.Logf("%s: %s", name, time.Since(start).Round(time.Millisecond))
}

func (b *browserTab) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.fail("text of "+sel, err)
	}
	return strings.TrimSpace(s)
}

func (b *browserTab) count(sel string) int {
	b.t.Helper()
	nodes, err := chromedp.Run(b.ctx, chromedp.Nodes(chromedp.CSSAll(sel), chromedp.AtLeast(0)))
	if err != nil {
		b.fail("count "+sel, err)
	}
	return len(nodes)
}

func (b *browserTab) location() string {
	b.t.Helper()
	// Reading the URL evaluates script in the page: while the tab is
	// navigating (a form was just submitted) its execution context is gone
	// and Chromium answers "Inspected target navigated or closed". That is
	// the navigation in progress, not a failure: ask again (deadline-bound).
	for deadline := time.Now().Add(10 * time.Second); ; {
		loc, err := chromedp.Run(b.ctx, chromedp.Location())
		if err == nil {
			return loc
		}
		if !strings.Contains(err.Error(), "navigated or closed") || time.Now().After(deadline) {
			b.fail("location", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLocation waits (deadline-bound) until the tab's URL contains part:
// after a form's submit the old page still satisfies waits on elements.
func (b *browserTab) waitLocation(part string) {
	b.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(b.location(), part); {
		if time.Now().After(deadline) {
			b.t.Fatalf("the page did not navigate to %q; still at %s", part, b.location())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With tokens, in a real browser: the login form starts a session; a
// token scoped to reports/* sees the principal on its intent and is refused
// another resource's intent; signing out ends the session (the pages ask
// to sign in again). An unscoped operator previews a bulk retry of the
// failed email intents (a dry run: the count, nothing changed), applies
// it, and each intent's timeline records the retry with the actor and the
// note.
func TestPagesSessionsAndBulkInBrowser(t *testing.T) {
	t.Parallel()
	const scopedOp = "reports-ops-secret-0123456789"
	toks := append(slices.Clone(testTokens), Token{Name: "reports-ops", Role: RoleOperator, Secret: scopedOp, Resources: []string{"reports/*"}})
	pool := testdb.New(t)
	s := newServer(t, pool, toks, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	e := &env{t: t, pool: pool, srv: s, ts: ts, issuer: s.cfg.Issuer, ob: s.cfg.Outbox}
	e.atEpochOne("reports/daily", "payroll")
	mine := e.seedIntent(workerSecret, "reports/daily", "r-1", outbox.StatusFailed, "550 mailbox unavailable")
	other := e.seedIntent(workerSecret, "payroll", "p-1", outbox.StatusFailed, "550 mailbox unavailable")
	third := e.seedIntent(workerSecret, "payroll", "p-2", outbox.StatusFailed, "550 mailbox unavailable")
	untouched := e.seedIntent(workerSecret, "payroll", "p-3", outbox.StatusUnknown, "lost")

	b := &browserTab{t: t, ctx: browser(t, 2*time.Minute)}
	signIn := func(token, next string) {
		t.Helper()
		b.step("open "+next+" signed out", chromedp.Navigate(ts.URL+next), chromedp.WaitVisible(chromedp.ID("login-form")))
		b.step("sign in",
			chromedp.SendKeys(chromedp.ID("token"), token),
			chromedp.Click(chromedp.ID("sign-in")),
		)
		b.waitLocation(next)
	}

	signIn(scopedOp, fmt.Sprintf("/intents/%d", mine))
	b.step("the scoped operator's intent", chromedp.WaitVisible(chromedp.ID("principal")))
	if who, st := b.text("#principal"), b.text("#status"); who != "w1" || st != "failed" {
		t.Fatalf("intent page: enqueued by %q, status %q; want w1, failed", who, st)
	}
	if b.text("header .who") == "" || !strings.Contains(b.text("header .who"), "reports-ops") {
		t.Fatalf("header shows %q, want the viewer reports-ops", b.text("header .who"))
	}
	b.step("another resource's intent", chromedp.Navigate(fmt.Sprintf("%s/intents/%d", ts.URL, other)), chromedp.WaitVisible(chromedp.CSS("main")))
	if body := b.text("main"); !strings.Contains(body, "may not act on resource") || strings.Contains(body, "p-1") {
		t.Fatalf("another resource's intent page shows %q, want the refusal only", body)
	}
	if b.count("#bulk") != 0 {
		t.Fatal("a scoped operator is offered bulk actions")
	}
	b.step("sign out",
		chromedp.Navigate(ts.URL+"/intents?resource=reports/daily"),
		chromedp.WaitVisible(chromedp.CSS(`header form[action="/logout"] button`)),
		chromedp.Click(chromedp.CSS(`header form[action="/logout"] button`)),
	)
	b.waitLocation("/login")
	b.step("the pages after signing out", chromedp.Navigate(ts.URL+"/intents"), chromedp.WaitVisible(chromedp.ID("login-form")))

	signIn(operatorSecret, "/intents?status=failed")
	b.step("the failed list", chromedp.WaitVisible(chromedp.CSS("#intents tbody tr")))
	if n := b.count("#intents tbody tr"); n != 3 {
		t.Fatalf("the failed list shows %d intents, want 3", n)
	}
	b.step("preview a bulk retry of payroll's",
		chromedp.Click(chromedp.CSS("#bulk summary")),
		chromedp.WaitVisible(chromedp.ID("bulk-preview")),
		chromedp.SetValue(chromedp.CSS(`#bulk-form select[name="action"]`), "retry"),
		chromedp.SendKeys(chromedp.CSS(`#bulk-form input[name="resource_prefix"]`), "pay"),
		chromedp.SendKeys(chromedp.CSS(`#bulk-form input[name="since"]`), "1h"),
		chromedp.SendKeys(chromedp.CSS(`#bulk-form textarea[name="note"]`), "mail server fixed"),
		chromedp.Click(chromedp.ID("bulk-preview")),
	)
	b.waitLocation("/intents/bulk")
	b.step("the dry run's answer", chromedp.WaitVisible(chromedp.ID("bulk-apply")))
	if c := b.text("#bulk-count"); !strings.Contains(c, "would touch 2 intents") {
		t.Fatalf("preview says %q, want 2 intents", c)
	}
	for _, id := range []int64{mine, other, third} {
		if st := e.status(id); st != outbox.StatusFailed {
			t.Fatalf("intent %d is %s after the dry run, want failed", id, st)
		}
	}
	b.step("apply it", chromedp.Click(chromedp.ID("bulk-apply")))
	b.waitLocation("bulk=retry")
	b.step("the list after it", chromedp.WaitVisible(chromedp.ID("flash")))
	if f := b.text("#flash"); !strings.Contains(f, "Bulk retry: 2 intents changed") {
		t.Fatalf("flash %q", f)
	}
	for id, want := range map[int64]outbox.Status{mine: outbox.StatusFailed, other: outbox.StatusPending, third: outbox.StatusPending, untouched: outbox.StatusUnknown} {
		if st := e.status(id); st != want {
			t.Errorf("intent %d is %s, want %s", id, st, want)
		}
	}
	b.step("a retried intent's timeline", chromedp.Navigate(fmt.Sprintf("%s/intents/%d", ts.URL, other)), chromedp.WaitVisible(chromedp.ID("timeline")))
	if tl := b.text("#timeline"); !strings.Contains(tl, "retry") || !strings.Contains(tl, "op1") || !strings.Contains(tl, "mail server fixed") {
		t.Fatalf("timeline: %q", tl)
	}
}
