package cli

import (
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/admin"
)

// gateway token new prints a new random token of 256 bits as
// {"token": "…"} (base64url, no padding), a new one each time; with --name
// and --role also the tokens file's line for it, which the gateway loads.
// A bad role or name is exit 2 naming it.
func TestTokenNew(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 5 {
		r := gw(t, "", "token", "new")
		expectCode(t, r, 0, "")
		tok, _ := r.obj["token"].(string)
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) < 16 || len(b) != 32 {
			t.Fatalf("token %q: %d bytes (%v), want 32 bytes of base64url", tok, len(b), err)
		}
		if seen[tok] {
			t.Fatalf("token %q printed twice", tok)
		}
		seen[tok] = true
		if _, err := admin.ParseTokens("x:worker:" + tok); err != nil {
			t.Fatalf("the gateway refuses its own new token: %v", err)
		}
	}
	r := gw(t, "", "token", "new", "--name", "ops-alice", "--role", "operator")
	expectCode(t, r, 0, "")
	tok, _ := r.obj["token"].(string)
	line, _ := r.obj["line"].(string)
	if line != "ops-alice:operator:"+tok || r.obj["name"] != "ops-alice" || r.obj["role"] != "operator" {
		t.Fatalf("token new --name --role = %s", r.stdout)
	}
	got, err := admin.ParseTokens(line)
	if err != nil || len(got) != 1 || got[0].Name != "ops-alice" || got[0].Role != admin.RoleOperator || got[0].Secret != tok {
		t.Fatalf("the line does not load: %+v %v", got, err)
	}
	for _, bad := range []struct {
		args  []string
		field string
	}{
		{[]string{"--name", "ops", "--role", "admin"}, "role"},
		{[]string{"--role", "worker"}, "name"},
		{[]string{"--name", "a:b", "--role", "worker"}, "name"},
		{[]string{"extra"}, "args"},
	} {
		r := gw(t, "", append([]string{"token", "new"}, bad.args...)...)
		expectCode(t, r, exitBadInput, "invalid_input")
		if e, _ := r.obj["error"].(map[string]any); e["field"] != bad.field {
			t.Errorf("token new %v: %s, want field %q", bad.args, r.stdout, bad.field)
		}
	}
	r = gw(t, "", "token")
	expectCode(t, r, exitBadInput, "invalid_input")
	t.Logf("%d distinct tokens", len(seen))
}

// --print-config and --help show no password of any URL-valued flag
// (--mailpit-url, --s3-endpoint, --database-url, --nats-url), given on
// the command line or in the environment.
func TestPrintConfigRedactsEveryURL(t *testing.T) {
	t.Parallel()
	env := []string{
		"GATEWAY_MAILPIT_URL=http://mp-user:mailpit-pass-s3cret@mailpit.example:8025",
		"GATEWAY_S3_ENDPOINT=https://AKIDEXAMPLE:s3-pass-s3cret@s3.example:9000",
	}
	r := gwEnv(t, env, "postgres://app:db-pass-s3cret@db.example/app", "run", "--print-config",
		"--nats-url", "nats://u:nats-pass-s3cret@n1.example:4222,nats://u:nats-pass-s3cret@n2.example:4222")
	expectCode(t, r, 0, "")
	cfg, _ := r.obj["config"].(map[string]any)
	for flag, host := range map[string]string{"mailpit-url": "mailpit.example", "s3-endpoint": "s3.example", "database-url": "db.example", "nats-url": "n2.example"} {
		if v, _ := cfg[flag].(string); !strings.Contains(v, host) || !strings.Contains(v, "xxxxx") {
			t.Errorf("config[%s] = %q, want the URL with its password redacted", flag, v)
		}
	}
	r2 := gwEnv(t, env, "postgres://app:db-pass-s3cret@db.example/app", "run", "--print-config",
		"--mailpit-url", "http://mp-user:mailpit-pass-s3cret@mailpit.example:8025", "--s3-endpoint", "https://AK:s3-pass-s3cret@s3.example")
	expectCode(t, r2, 0, "")
	cmd := exec.Command(gatewayBin, "run", "--help")
	cmd.Env = append(append(os.Environ(), "GATEWAY_DATABASE_URL=postgres://app:db-pass-s3cret@db.example/app"), env...)
	help, _ := cmd.CombinedOutput()
	for _, out := range []string{r.stdout + r.stderr, r2.stdout + r2.stderr} {
		for _, secret := range []string{"mailpit-pass-s3cret", "s3-pass-s3cret", "db-pass-s3cret", "nats-pass-s3cret"} {
			if strings.Contains(out, secret) {
				t.Errorf("--print-config shows %q:\n%s", secret, out)
			}
		}
	}
	if !strings.Contains(string(help), "-mailpit-url") || strings.Contains(string(help), "s3cret") {
		t.Errorf("--help shows a secret:\n%s", help)
	}
}

// --metrics-addr serves /metrics and the probes without a token: it must
// be a loopback address unless --metrics-allow-remote says otherwise (exit
// 2 naming metrics_addr). On loopback it answers only a loopback Host
// (/healthz any), against DNS rebinding; with --metrics-allow-remote any
// address and Host. Through the same run, the admin server limits failed
// authentications (429 with Retry-After).
func TestRunMetricsLoopbackOnly(t *testing.T) {
	t.Parallel()
	runBadFlagCases(t, strings.Repeat("x", 24), []badFlagCase{
		{"all interfaces", nil, []string{"--adapters", "", "--metrics-addr", "0.0.0.0:0"}, "metrics_addr"},
		{"no host", nil, []string{"--adapters", "", "--metrics-addr", ":9090"}, "metrics_addr"},
		{"a host name", nil, []string{"--adapters", "", "--metrics-addr", "example.com:9090"}, "metrics_addr"},
		{"a weak token", []string{"GATEWAY_TOKENS=ops:operator:" + strings.Repeat("x", 24)}, []string{"--adapters", "", "--admin-addr", "127.0.0.1:0"}, "tokens"},
	})

	const secret = "op-secret-0123456789abcdef"
	e := newRunEnv(t)
	loop, admAddr := freeAddr(t), freeAddr(t)
	p := e.run(t, []string{"GATEWAY_TOKENS=ops:operator:" + secret}, "--adapters", "", "--metrics-addr", loop, "--admin-addr", admAddr)
	get := func(base, path, host, bearer string) (int, http.Header) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if host != "" {
			req.Host = host
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		res, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return 0, nil
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode, res.Header
	}
	base := "http://" + loop
	pollUntil(t, 30*time.Second, "the metrics address", func() (bool, string) {
		code, _ := get(base, "/readyz", "", "")
		return code == http.StatusOK, strconv.Itoa(code)
	})
	for path, want := range map[string]int{"/metrics": 421, "/readyz": 421, "/healthz": 200} {
		if code, _ := get(base, path, "rebind.attacker.example", ""); code != want {
			t.Errorf("metrics address %s with a foreign Host: %d, want %d", path, code, want)
		}
		if code, _ := get(base, path, "", ""); code != http.StatusOK {
			t.Errorf("metrics address %s: %d, want 200", path, code)
		}
	}
	adm := "http://" + admAddr
	for i := range admin.DefaultAuthFailureLimit {
		if code, _ := get(adm, "/api/v1/intents", "", "guessed-token-0123456789"); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i+1, code)
		}
	}
	code, hdr := get(adm, "/api/v1/intents", "", secret)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("after %d failures: %d Retry-After %q, want 429 with Retry-After", admin.DefaultAuthFailureLimit, code, hdr.Get("Retry-After"))
	}
	if out := p.stderr.String(); !strings.Contains(out, "authentication failed") || strings.Contains(out, "guessed-token") {
		t.Errorf("the log of failures:\n%s", out)
	}
	p.stop(t)

	remote := freeAddr(t)
	_, port, _ := strings.Cut(remote, ":")
	p = e.run(t, nil, "--adapters", "", "--metrics-addr", "0.0.0.0:"+port, "--metrics-allow-remote")
	pollUntil(t, 30*time.Second, "the remote metrics address", func() (bool, string) {
		code, _ := get("http://"+remote, "/metrics", "metrics.example", "")
		return code == http.StatusOK, strconv.Itoa(code)
	})
	p.stop(t)
}

// The tokens file's check of a weak secret names the file's field and not
// the secret.
func TestRunWeakTokensFile(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(f, []byte("ops:operator:abcdefghijklmnopqrstu\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := runBadFlags(t, nil, []string{"--adapters", "", "--admin-addr", "127.0.0.1:0", "--tokens-file", f}, "tokens_file"); strings.Contains(out, "abcdefghijklmnopqrstu") || !strings.Contains(out, `\"ops\"`) && !strings.Contains(out, `"ops"`) {
		t.Fatalf("weak tokens file: %s", out)
	}
}
