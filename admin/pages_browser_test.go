package admin

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
		chromedp.Click(chromedp.CSS(`#tabs a[data-status="failed"]`)),
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
	if body := b.text("main"); !strings.Contains(body, "may not act on this intent") || strings.Contains(body, "p-1") {
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

// screenshotDir is where the browser tests keep their screenshots, a
// directory per test: $FENCEGATE_SCREENSHOTS/<test> when set, else
// var/screenshots/<schema>/<test> at the repository's root (var/ is
// ignored by git; scripts/test.sh runs both schemas). Kept after the test,
// whatever its outcome, for a person to look at.
func screenshotDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("FENCEGATE_SCREENSHOTS")
	if root == "" {
		root = filepath.Join("..", "var", "screenshots", testdb.Schema())
	}
	dir, err := filepath.Abs(filepath.Join(root, t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// shot saves a full-page screenshot of the tab as dir/name.png.
func (b *browserTab) shot(dir, name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.fail("screenshot "+name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// eval evaluates a JavaScript expression in the tab (DevTools'
// evaluation: the pages' Content-Security-Policy allows no script of
// their own, and this is none of theirs).
func eval[T any](b *browserTab, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.fail("evaluate "+expr, err)
	}
	return v
}

// The list page made for triage, in a real browser: status tabs count the
// intents under the other filters; a search by idempotency key and by a
// webhook's URL finds the one intent; times are relative with the
// absolute time on hover; a long, multi-line error stays on one line;
// the table uses the window's width; the resources index shows each
// resource's epoch, holder, lease expiry and intents by status; rows
// picked on the list feed the bulk action, whose preview lists the ids it
// would touch, and applying it changes those and no others. Screenshots of
// each page are kept (screenshotDir).
func TestTriagePagesInBrowser(t *testing.T) {
	e := setupNoTokens(t)
	ctx := context.Background()
	dir := screenshotDir(t)
	e.atEpochOne("reports")
	l, err := e.issuer.Acquire(ctx, "billing/eu", "worker-7", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(in outbox.Intent, status outbox.Status, lastError string) int64 {
		t.Helper()
		res, err := e.ob.Enqueue(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if status != outbox.StatusPending {
			e.setStatus(res.IntentID, status, lastError)
		}
		return res.IntentID
	}
	email := []byte(`{"to":"alice@example.com","from":"reports@example.com","subject":"hi","text":"body"}`)
	longErr := "550 5.1.1 <bob@example.com>: Recipient address rejected: User unknown in virtual mailbox table\n" +
		strings.Repeat("remote said: the mailbox is gone and the server explains why at length; ", 8)
	var failed []int64
	failed = append(failed, enqueue(outbox.Intent{Resource: "reports", Epoch: 1, OperationID: "daily-1", Kind: "email", Payload: email}, outbox.StatusFailed, longErr))
	failed = append(failed, enqueue(outbox.Intent{Resource: "reports", Epoch: 1, OperationID: "daily-2", Kind: "email", Payload: email}, outbox.StatusFailed, "421 try later"))
	keyed := enqueue(outbox.Intent{Resource: "reports", Epoch: 1, OperationID: "inv-42", Kind: "email", IdempotencyKey: "invoice-2026-0042", Payload: email},
		outbox.StatusFailed, "550 mailbox unavailable")
	failed = append(failed, keyed)
	hook := enqueue(outbox.Intent{Resource: "billing/eu", Epoch: l.Epoch, OperationID: "pay-1", Kind: "webhook",
		Payload: []byte(`{"url":"https://hooks.example.com/payroll","body":{"n":1}}`)}, outbox.StatusFailed, "HTTP 503")
	failed = append(failed, hook)
	enqueue(outbox.Intent{Resource: "reports", Epoch: 1, OperationID: "lost-1", Kind: "email", Payload: email}, outbox.StatusUnknown, "connection reset after DATA")
	enqueue(outbox.Intent{Resource: "reports", Epoch: 1, OperationID: "ok-1", Kind: "email", Payload: email}, outbox.StatusSucceeded, "")
	enqueue(outbox.Intent{Resource: "reports", Epoch: 1, OperationID: "ok-2", Kind: "email", Payload: email}, outbox.StatusSucceeded, "")
	enqueue(outbox.Intent{Resource: "reports", Epoch: 1, OperationID: "new-1", Kind: "email", Payload: email}, outbox.StatusPending, "")

	b := &browserTab{t: t, ctx: browser(t, 2*time.Minute)}
	tabCount := func(status string) string {
		t.Helper()
		return b.text(fmt.Sprintf(`#tabs a[data-status=%q] .count`, status))
	}

	// A window wider than the old 1200 px cap: the table takes it.
	b.step("open the list, 1600 px wide", chromedp.EmulateViewport(1600, 900), chromedp.Navigate(e.ts.URL+"/intents"), chromedp.WaitVisible(chromedp.ID("intents")))
	b.shot(dir, "01-list")
	want := map[string]string{"all": "8", "pending": "1", "relayed": "0", "succeeded": "2", "failed": "4", "superseded": "0", "unknown": "1", "cancelled": "0"}
	for st, n := range want {
		if got := tabCount(st); got != n {
			t.Errorf("tab %s counts %q, want %s", st, got, n)
		}
	}
	t.Logf("tabs: %d statuses checked", len(want))
	if w := eval[float64](b, `document.querySelector("main").getBoundingClientRect().width`); w < 1500 {
		t.Errorf("main is %.0f px wide in a 1600 px window: a width cap is left", w)
	}
	// One line for the long, two-line error: its row is as tall as a row
	// with a short one; the full text is on hover (and on the intent's page).
	tall := eval[float64](b, fmt.Sprintf(`document.querySelector('tr[data-intent="%d"]').getBoundingClientRect().height`, failed[0]))
	short := eval[float64](b, fmt.Sprintf(`document.querySelector('tr[data-intent="%d"]').getBoundingClientRect().height`, failed[1]))
	if tall > short+1 || short == 0 {
		t.Errorf("the row with a long error is %.0f px tall, one with a short error %.0f px: the error wraps", tall, short)
	}
	if title := eval[string](b, fmt.Sprintf(`document.querySelector('tr[data-intent="%d"] td.err span').title`, failed[0])); !strings.Contains(title, "at length") {
		t.Errorf("the long error's title is %q, want the full text", title)
	}
	// Relative times with the absolute one on hover.
	absolute := regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z$`)
	times := eval[[]string](b, `Array.from(document.querySelectorAll("#intents time")).map(t => t.textContent + "|" + t.title)`)
	if len(times) != 16 {
		t.Errorf("%d times on the list, want 16 (created and updated of 8 intents)", len(times))
	}
	for _, tm := range times {
		rel, abs, _ := strings.Cut(tm, "|")
		if !(rel == "just now" || strings.HasSuffix(rel, " ago")) || !absolute.MatchString(abs) {
			t.Errorf("time %q: want a relative time with the absolute one as its title", tm)
		}
	}
	t.Logf("times: %d checked", len(times))

	b.step("search by idempotency key",
		chromedp.SendKeys(chromedp.ID("search"), "INVOICE-2026-0042"),
		chromedp.Click(chromedp.ID("apply-filters")),
	)
	b.waitLocation("q=INVOICE")
	b.step("the search's page", chromedp.WaitVisible(chromedp.CSS("#intents tbody tr")))
	b.shot(dir, "02-search-key")
	if rows := eval[[]string](b, `Array.from(document.querySelectorAll("#intents tbody tr")).map(r => r.dataset.intent)`); !slices.Equal(rows, []string{strconv.FormatInt(keyed, 10)}) {
		t.Fatalf("search by key shows intents %v, want [%d]", rows, keyed)
	}
	if all, failedN, ok := tabCount("all"), tabCount("failed"), tabCount("succeeded"); all != "1" || failedN != "1" || ok != "0" {
		t.Errorf("tabs under the search: all %s, failed %s, succeeded %s; want 1, 1, 0", all, failedN, ok)
	}
	b.step("search by the webhook's URL", chromedp.Navigate(e.ts.URL+"/intents?q=hooks.example.com/pay"), chromedp.WaitVisible(chromedp.CSS("#intents tbody tr")))
	if rows := eval[[]string](b, `Array.from(document.querySelectorAll("#intents tbody tr")).map(r => r.dataset.intent)`); !slices.Equal(rows, []string{strconv.FormatInt(hook, 10)}) {
		t.Fatalf("search by URL shows intents %v, want [%d]", rows, hook)
	}
	if d := b.text(fmt.Sprintf(`tr[data-intent="%d"] td.dest`, hook)); d != "https://hooks.example.com/payroll" {
		t.Errorf("the webhook's destination shows %q", d)
	}

	b.step("the resources index", chromedp.Click(chromedp.CSS(`header a[href="/resources"]`)), chromedp.WaitVisible(chromedp.ID("resources")))
	b.shot(dir, "03-resources")
	billing := `#resources tr[data-resource="billing/eu"]`
	if ep, holder, expiry := b.text(billing+" td.epoch"), b.text(billing+" td.holder"), b.text(billing+" td.expiry"); ep != strconv.FormatInt(l.Epoch, 10) || holder != "worker-7" ||
		!strings.HasPrefix(expiry, "in ") || !strings.Contains(expiry, "live") {
		t.Errorf("billing/eu: epoch %q, holder %q, lease %q; want %d, worker-7, in …· live", ep, holder, expiry, l.Epoch)
	}
	reports := `#resources tr[data-resource="reports"]`
	for st, n := range map[string]string{"failed": "3", "unknown": "1", "succeeded": "2", "pending": "1", "cancelled": "0"} {
		if got := b.text(fmt.Sprintf(`%s td[data-status=%q]`, reports, st)); got != n {
			t.Errorf("reports: %s %q, want %s", st, got, n)
		}
	}
	if holder := b.text(reports + " td.holder"); holder != "none" {
		t.Errorf("reports' holder %q, want none", holder)
	}
	if n := b.count("#resources tbody tr"); n != 2 {
		t.Errorf("the index lists %d resources, want 2", n)
	}

	// Pick two of the four failed intents and preview a bulk retry.
	b.step("the failed tab", chromedp.Navigate(e.ts.URL+"/intents?status=failed"), chromedp.WaitVisible(chromedp.CSS("#intents tbody tr")))
	picked := []int64{failed[1], hook}
	slices.Sort(picked)
	b.step("pick two rows and preview a retry",
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-intent="%d"] input[name="id"]`, picked[0]))),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-intent="%d"] input[name="id"]`, picked[1]))),
		chromedp.Click(chromedp.CSS("#bulk summary")),
		chromedp.WaitVisible(chromedp.ID("bulk-preview")),
		chromedp.SetValue(chromedp.CSS(`#bulk-form select[name="action"]`), "retry"),
	)
	b.shot(dir, "04-picked")
	b.step("preview", chromedp.Click(chromedp.ID("bulk-preview")))
	b.waitLocation("/intents/bulk")
	b.step("the dry run's answer", chromedp.WaitVisible(chromedp.ID("bulk-apply")))
	b.shot(dir, "05-bulk-preview")
	previewIDs := func() []string {
		return eval[[]string](b, `Array.from(document.querySelectorAll("#bulk-ids a")).map(a => a.dataset.intent)`)
	}
	ids := func(ns []int64) []string {
		out := make([]string, len(ns))
		for i, n := range ns {
			out[i] = strconv.FormatInt(n, 10)
		}
		return out
	}
	if c, got := b.text("#bulk-count"), previewIDs(); !strings.Contains(c, "would touch 2 intents") || !slices.Equal(got, ids(picked)) {
		t.Fatalf("preview says %q and lists %v; want 2 intents, %v", c, got, ids(picked))
	}
	t.Logf("preview lists %d ids", len(picked))
	b.step("apply it", chromedp.Click(chromedp.ID("bulk-apply")))
	b.waitLocation("bulk=retry")
	b.step("the list after it", chromedp.WaitVisible(chromedp.ID("flash")))
	if f := b.text("#flash"); !strings.Contains(f, "Bulk retry: 2 intents changed") {
		t.Fatalf("flash %q", f)
	}
	for _, id := range failed {
		want := outbox.StatusFailed
		if slices.Contains(picked, id) {
			want = outbox.StatusPending
		}
		if st := e.status(id); st != want {
			t.Errorf("intent %d is %s, want %s", id, st, want)
		}
	}
	// Nothing picked: the preview lists every failed intent the filter
	// selects (the two left).
	b.step("preview without picking", chromedp.Click(chromedp.CSS("#bulk summary")), chromedp.WaitVisible(chromedp.ID("bulk-preview")),
		chromedp.Click(chromedp.ID("bulk-preview")))
	b.waitLocation("/intents/bulk")
	b.step("the second dry run", chromedp.WaitVisible(chromedp.ID("bulk-ids")))
	left := []int64{failed[0], keyed}
	slices.Sort(left)
	if c, got := b.text("#bulk-count"), previewIDs(); !strings.Contains(c, "would touch 2 intents") || !slices.Equal(got, ids(left)) {
		t.Fatalf("preview says %q and lists %v; want 2 intents, %v", c, got, ids(left))
	}
}
