package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file holding a secret that group or others may read is warned about
// when gateway run starts, for every flag that names one. Only the tokens,
// SMTP password and S3 receipt secret files were: a NATS seed or creds
// file, a TLS key and a webhook header secret started silently.
func TestRunWarnsOfReadableSecretFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Nothing listens at the database URL: each run stops soon after its
	// start, whatever else is wrong; the warning comes first.
	const nowhere = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	for _, c := range []struct {
		field string
		args  []string
	}{
		{"nats_nkey", []string{"--nats-nkey", file("seed", "SUAEXAMPLE")}},
		{"nats_creds", []string{"--nats-creds", file("creds", "creds")}},
		{"nats_tls_key", []string{"--nats-tls-cert", file("nc.pem", "cert"), "--nats-tls-key", file("nk.pem", "key")}},
		{"tls_key", []string{"--admin-addr", "127.0.0.1:0", "--tls-cert", file("ac.pem", "cert"), "--tls-key", file("ak.pem", "key")}},
		{"webhook_header_secret", []string{"--adapters", "webhook", "--webhook-allow", "h.example", "--webhook-header-secret", "api=" + file("hs", "s3cret")}},
	} {
		args := append([]string{"run", "--nats-url", "nats://127.0.0.1:1"}, c.args...)
		if c.field != "webhook_header_secret" {
			args = append(args, "--adapters", "")
		}
		r := gwOut(t, nil, nowhere, args...)
		if r.code == 0 {
			t.Fatalf("%s: gateway run exited 0", c.field)
		}
		if !strings.Contains(r.stderr, "readable by group or others") || !strings.Contains(r.stderr, "field="+c.field) {
			t.Errorf("%s: no warning naming the file's field (exit %d):\n%s", c.field, r.code, r.stderr)
		}
	}
}
