package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// No secret in output: --help prints flag defaults, some of which come
// from the environment ($GATEWAY_DATABASE_URL, and $GATEWAY_SMTP_PASSWORD
// was one); none shows a password, a token or a secret, in any command's
// help.
func TestHelpShowsNoSecret(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"GATEWAY_DATABASE_URL": "postgres://app:db-pass-s3cret@db.example:5432/app?sslmode=require&password=qry-pass-s3cret",
		// A multi-host URL (libpq's failover form), redacted as one URL.
		"GATEWAY_DATABASE_DIRECT_URL": "postgres://app:direct-pass-s3cret@pg-a:5432,pg-b:5432/app?target_session_attrs=read-write",
		"GATEWAY_SMTP_PASSWORD":       "smtp-pass-s3cret",
		"GATEWAY_NATS_URL":            "nats://nats-token-s3cret@nats.example:4222",
		"GATEWAY_WEBHOOK_SECRET":      "whsec_d2ViaG9vay1zZWNyZXQtczNjcmV0LWJ5dGVz",
	}
	for _, cmd := range [][]string{{"run", "--help"}, {"enqueue", "--help"}, {"status", "--help"}, {"migrate", "--help"}, {"lease", "acquire", "--help"}, {"run", "--print-config"}} {
		var out, errOut bytes.Buffer
		Main(context.Background(), cmd, Options{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }})
		all := out.String() + errOut.String()
		for _, secret := range []string{"db-pass-s3cret", "qry-pass-s3cret", "smtp-pass-s3cret", "nats-token-s3cret", "d2ViaG9vay1zZWNyZXQ", "direct-pass-s3cret"} {
			if strings.Contains(all, secret) {
				t.Errorf("gateway %s shows %q:\n%s", strings.Join(cmd, " "), secret, all)
			}
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:pw@h/db":                      "postgres://u:xxxxx@h/db",
		"postgres://u@h/db?password=pw&sslmode=off": "postgres://u@h/db?password=xxxxx&sslmode=off",
		"nats://tok@h:4222":                         "nats://xxxxx@h:4222",
		"nats://user:pw@h:4222":                     "nats://user:xxxxx@h:4222",
		"postgres://u@h/db":                         "postgres://u@h/db",
		"postgres://u:pw@a:5432,b:5432/db?target_session_attrs=read-write": "postgres://u:xxxxx@a:5432,b:5432/db?target_session_attrs=read-write",
		"not a url": "(configured URL)",
		// pgx reads these otherwise (user info up to the first '@', none
		// past a '/'): the password's pieces would show, so none of it is.
		"postgres://u:pw@tail@h/db":     "(configured URL)",
		"postgres://u:4711/tail@h/db":   "(configured URL)",
		"postgres://h?password=pw@tail": "(configured URL)",
		// Signed URLs: an S3 presigned URL's signature, an Azure SAS's sig.
		"https://b.s3.example/k?X-Amz-Signature=abc123&X-Amz-Expires=60": "https://b.s3.example/k?X-Amz-Expires=60&X-Amz-Signature=xxxxx",
		"https://a.blob.example/c?sv=2024&sig=abc123":                    "https://a.blob.example/c?sig=xxxxx&sv=2024",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
