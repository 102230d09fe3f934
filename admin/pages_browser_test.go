package admin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

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
	ctx := context.Background()
	if _, err := e.issuer.Advance(ctx, "nightly-report", 1); err != nil {
		t.Fatal(err)
	}
	e.seedIntent("", "nightly-report", "2026-11-29", outbox.StatusSucceeded, "")
	e.seedIntent("", "nightly-report", "2026-11-30", outbox.StatusUnknown, "smtp: connection reset after DATA")
	failed := e.seedIntent("", "nightly-report", "2026-12-01", outbox.StatusFailed, "550 5.1.1 mailbox unavailable")
	e.seedIntent("", "nightly-report", "2026-12-02", outbox.StatusPending, "")

	fail := func(what string, err error) {
		t.Helper()
		html, _ := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("html")))
		t.Fatalf("%s: %v\npage:\n%s", what, err, html)
	}
	step := func(name string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		start := time.Now()
		if err := chromedp.Do(bctx, steps...); err != nil {
			fail(name, err)
		}
		t.Logf("%s: %s", name, time.Since(start).Round(time.Millisecond))
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			fail("text of "+sel, err)
		}
		return strings.TrimSpace(s)
	}
	count := func(sel string) int {
		t.Helper()
		nodes, err := chromedp.Run(bctx, chromedp.Nodes(chromedp.CSSAll(sel), chromedp.AtLeast(0)))
		if err != nil {
			fail("count "+sel, err)
		}
		return len(nodes)
	}
	location := func() string {
		t.Helper()
		loc, err := chromedp.Run(bctx, chromedp.Location())
		if err != nil {
			fail("location", err)
		}
		return loc
	}

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
			fail("screenshot", err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
}
