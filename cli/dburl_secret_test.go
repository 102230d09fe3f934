package cli

import (
	"strings"
	"testing"
)

// No part of a database password is printed, whatever the URL's form:
// pgx (like libpq) ends a URL's user info at the first '@', a URL parser
// (the redaction's) at the last, so an unencoded '@' (or a '/' before it)
// put the password's tail in the host, the database or the user pgx's
// error names ("lookup <tail>@127.0.0.1: no such host") after a prefix
// that claimed the password hidden; and a key=value string that does not
// parse was quoted by pgx with only "password=<no space>" masked, so
// "password = x" and "password=a\ x" showed x. Such a URL is now exit 2
// naming the field, no part of it shown; one that parses is still shown
// redacted.
func TestDatabaseURLPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, url string
		pieces    []string // parts of the password, none to be printed
	}{
		{"unencoded @", "postgres://gw:PWa@PWb@127.0.0.1:1/app?connect_timeout=1", []string{"PWa", "PWb"}},
		{"unencoded @, multi-host", "postgres://gw:PWa@PWb@127.0.0.1:1,127.0.0.1:2/app?connect_timeout=1", []string{"PWa", "PWb"}},
		{"@ in a query before any path", "postgres://127.0.0.1:1?password=PWa@PWb", []string{"PWa", "PWb"}},
		{"unencoded / in the password", "postgres://gw:4711/PWb@127.0.0.1:1/app", []string{"4711", "PWb"}},
		{"key=value, spaces around =", "host=127.0.0.1 port=abc user=u password = PWa", []string{"PWa"}},
		{"key=value, escaped space", `host=127.0.0.1 port=abc user=u password=PWa\ PWb`, []string{"PWa", "PWb"}},
		{"key=value, unquoted space", "host=127.0.0.1 port=1 user=u password=PWa PWb", []string{"PWa", "PWb"}},
		{"bad escape", "postgres://gw:PWa%zz@127.0.0.1:1/app", []string{"PWa"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			check := func(what string, r cliResult, field string) {
				t.Helper()
				if r.code != exitBadInput || errorField(r) != field {
					t.Errorf("%s: exit %d %s; want exit 2 naming %s", what, r.code, r.stdout, field)
				}
				for _, p := range c.pieces {
					if strings.Contains(r.stdout+r.stderr, p) {
						t.Errorf("%s shows %q of the password: %s %s", what, p, r.stdout, r.stderr)
					}
				}
			}
			check("status, $GATEWAY_DATABASE_URL", gw(t, c.url, "status", "1"), "database_url")
			check("status --database-url", gw(t, "", "status", "1", "--database-url", c.url), "database_url")
			check("migrate, $GATEWAY_DATABASE_DIRECT_URL", gwEnv(t, []string{"GATEWAY_DATABASE_DIRECT_URL=" + c.url}, "", "migrate"), "database_direct_url")
			if out := runBadFlags(t, []string{"GATEWAY_DATABASE_URL=" + c.url}, []string{"--adapters", "file", "--nats-url", "nats://127.0.0.1:1"}, "database_url"); strings.Contains(out, "PW") {
				t.Errorf("gateway run shows the password: %s", out)
			}
		})
	}
	// A URL that parses (the '@' encoded) is shown redacted.
	r := gw(t, "postgres://gw:PWa%40PWb@127.0.0.1:1/app?connect_timeout=1", "status", "1")
	expectCode(t, r, 1, "unavailable")
	if !strings.Contains(r.stderr, "postgres://gw:xxxxx@127.0.0.1:1/app") || strings.Contains(r.stdout+r.stderr, "PW") {
		t.Errorf("an unreachable database: %s; want its URL redacted", r.stderr)
	}
}
