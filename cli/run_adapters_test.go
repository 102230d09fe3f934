package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Bad values of `gateway run`'s flags are exit 2 with a JSON error naming
// the field, before anything is connected (no database is given).
func TestRunBadFlags(t *testing.T) {
	t.Parallel()
	runBadFlagCases(t, "secret", []badFlagCase{
		{"unknown adapter", nil, []string{"--adapters", "email,sms"}, "adapters"},
		{"adapter twice", nil, []string{"--adapters", "file,file"}, "adapters"},
		{"nothing to run", nil, []string{"--dispatcher=false", "--adapters", ""}, "adapters"},
		{"starttls", nil, []string{"--smtp-starttls", "sometimes"}, "smtp_starttls"},
		{"smtp addr", nil, []string{"--smtp-addr", "mail.example.com"}, "smtp_addr"},
		{"mail lookup", nil, []string{"--mail-lookup", "imap"}, "mail_lookup"},
		{"mailpit without url", nil, []string{"--mail-lookup", "mailpit"}, "mailpit_url"},
		{"mailpit url scheme", nil, []string{"--mail-lookup", "mailpit", "--mailpit-url", "ftp://x"}, "mailpit_url"},
		{"mail domain", nil, []string{"--mail-domain", "a b"}, "mail_domain"},
		{"unknown outcome", nil, []string{"--unknown-outcome", "retry"}, "unknown_outcome"},
		{"concurrency", nil, []string{"--adapter-concurrency", "0"}, "adapter_concurrency"},
		{"max attempts", nil, []string{"--max-attempts", "0"}, "max_attempts"},
		{"intent retention shorter than key retention", nil, []string{"--intent-retention", "168h", "--key-retention", "720h"}, "intent_retention"},
		{"intent retention shorter than the default key retention", nil, []string{"--intent-retention", "168h"}, "intent_retention"},
		{"key retention longer than the default intent retention", nil, []string{"--key-retention", "1000h"}, "intent_retention"},
		{"lookup settle", nil, []string{"--lookup-settle", "0s"}, "lookup_settle"},
		{"ack wait not above the execute timeout", nil, []string{"--ack-wait", "30s"}, "ack_wait"},
		{"ack wait negative", nil, []string{"--ack-wait", "-1s", "--execute-timeout", "1s"}, "ack_wait"},
		{"duplicate window not above the claim ttl", nil, []string{"--duplicate-window", "30s"}, "duplicate_window"},
		{"stream max age below the duplicate window", nil, []string{"--stream-max-age", "1m"}, "stream_max_age"},
		{"claim ttl past the default duplicate window", nil, []string{"--claim-ttl", "5m"}, "duplicate_window"},
		{"password without user", []string{"GATEWAY_SMTP_PASSWORD=secret"}, nil, "smtp_user"},
		{"empty file root", nil, []string{"--adapters", "file", "--file-root", ""}, "file_root"},
		{"log level", nil, []string{"--log-level", "loud"}, "log_level"},
		{"not a number", nil, []string{"--max-attempts", "many"}, "max_attempts"},
		// Every flag also from the environment, checked alike; a value
		// that does not parse names the flag's field, not the value.
		{"env concurrency", []string{"GATEWAY_ADAPTER_CONCURRENCY=0"}, nil, "adapter_concurrency"},
		{"env not a duration", []string{"GATEWAY_LOOKUP_SETTLE=secret"}, nil, "lookup_settle"},
		{"log format", nil, []string{"--log-format", "xml"}, "log_format"},
		{"smtp max sessions", nil, []string{"--smtp-max-sessions", "0"}, "smtp_max_sessions"},
		{"file mode not octal", nil, []string{"--file-mode", "rw-r--r--"}, "file_mode"},
		{"file mode without owner rw", nil, []string{"--file-mode", "0444"}, "file_mode"},
		{"file allow pattern", nil, []string{"--adapters", "file", "--file-allow", "[bad"}, "file_allow"},
		// The adapters' own rules (their Config.Validate), named by flag,
		// before anything is connected, whether or not the adapter runs.
		{"smtp max sessions, email not running", nil, []string{"--adapters", "file", "--smtp-max-sessions", "0"}, "smtp_max_sessions"},
		{"smtp addr given, email not running", nil, []string{"--adapters", "file", "--smtp-addr", "mail.example.com"}, "smtp_addr"},
		{"mailpit url without mailpit lookup", nil, []string{"--mailpit-url", "ftp://x"}, "mailpit_url"},
		// A refused Mailpit URL is not echoed (it was, password included).
		{"mailpit url with a password", []string{"GATEWAY_MAIL_LOOKUP=mailpit", "GATEWAY_MAILPIT_URL=ftp://u:secret@h:1"}, nil, "mailpit_url"},
		{"mailpit url with a bad escape", nil, []string{"--mail-lookup", "mailpit", "--mailpit-url", "http://u:secret%zz@h:8025"}, "mailpit_url"},
		{"mailpit url with a query", nil, []string{"--mail-lookup", "mailpit", "--mailpit-url", "http://127.0.0.1:8025/?token=secret"}, "mailpit_url"},
		{"mail max recipients", nil, []string{"--mail-max-recipients", "0"}, "mail_max_recipients"},
		{"mail envelope from", nil, []string{"--mail-from-allow", "example.com", "--mail-envelope-from", "nobody"}, "mail_envelope_from"},
		{"file max bytes", nil, []string{"--adapters", "file", "--file-max-bytes", "-1"}, "file_max_bytes"},
		{"file allow, file not running", nil, []string{"--adapters", "email", "--mail-from-allow", "example.com", "--file-allow", "[bad"}, "file_allow"},
		{"s3 endpoint", nil, []string{"--adapters", "s3", "--s3-bucket", "reports", "--s3-endpoint", "127.0.0.1:9000"}, "s3_endpoint"},
		// The AWS SDK refused a query at start, exit 1, echoing the
		// endpoint; user info it ignores: both refused up front, not echoed.
		{"s3 endpoint with a query", nil, []string{"--adapters", "s3", "--s3-bucket", "reports", "--s3-endpoint", "http://ak:secret@127.0.0.1:9000/?token=secret"}, "s3_endpoint"},
		{"s3 endpoint with user info", []string{"GATEWAY_S3_ENDPOINT=http://ak:secret@127.0.0.1:9000"}, []string{"--adapters", "s3", "--s3-bucket", "reports"}, "s3_endpoint"},
		// A NATS URL of another scheme started a gateway that stayed
		// disconnected for ever; the URL (it may hold a password) is not
		// echoed.
		{"nats url scheme", nil, []string{"--nats-url", "http://u:nats-secret@127.0.0.1:4222"}, "nats_url"},
		{"nats url empty seed", nil, []string{"--nats-url", "nats://127.0.0.1:4222,"}, "nats_url"},
		// A seed without a scheme is dialled as nats://seed: checked the
		// same, its password not echoed (nats.go's parse error quoted it).
		{"nats url without scheme", nil, []string{"--nats-url", "u:secret%zz@127.0.0.1:4222"}, "nats_url"},
		{"nats url @ after the host", []string{"GATEWAY_NATS_URL=nats://u:4711/secret@127.0.0.1:4222"}, nil, "nats_url"},
	})
}

// Each part runs alone: a relay-only process (--adapters "") and an
// adapters-only process (--dispatcher=false --adapters file), started
// adapters first so they wait for the stream the relay creates, carry a
// file intent to succeeded together; both exit 0 on SIGTERM.
func TestRunPartsAlone(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	root := t.TempDir()

	adaptersOnly := e.run(t, nil, "--dispatcher=false", "--adapters", "file", "--file-root", root)
	pollUntil(t, 30*time.Second, "the adapters to wait for the stream", func() (bool, string) {
		return strings.Contains(adaptersOnly.stderr.String(), "waiting for stream"), adaptersOnly.stderr.String()
	})
	// SIGTERM while waiting for the stream is a clean stop too; this one is
	// left running, and a second one is started to show it.
	waiting := e.run(t, nil, "--dispatcher=false", "--adapters", "file", "--file-root", root)
	pollUntil(t, 30*time.Second, "the second adapters process to wait for the stream", func() (bool, string) {
		return strings.Contains(waiting.stderr.String(), "waiting for stream"), waiting.stderr.String()
	})
	if err := waiting.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waiting.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("adapters process stopped while waiting for the stream exited %d, want 0", code)
	}

	relayOnly := e.run(t, nil, "--adapters", "")

	id := enqueue(t, e.db, "--resource", "alone", "--epoch", acquireLease(t, e.db, "alone"), "--op", "f1", "--kind", "file",
		"--payload", `{"target":"a/b.txt","content":"alone"}`)
	res := resultOf(t, waitStatus(t, e.db, id, "succeeded"))
	if res["path"] != "a/b.txt" || res["sha256"] != sha256Of("alone") {
		t.Fatalf("result = %v", res)
	}
	if b, err := os.ReadFile(filepath.Join(root, "a/b.txt")); err != nil || string(b) != "alone" {
		t.Fatalf("file = %q, %v", b, err)
	}
	if strings.Contains(relayOnly.stderr.String(), "adapters: consuming") {
		t.Errorf("the relay-only process started adapters:\n%s", relayOnly.stderr.String())
	}

	adaptersOnly.stop(t)
	relayOnly.stop(t)
}

// runBadFlags runs `gateway run` with args (and extra environment, with the
// database URL and secrets cleared) and checks exit 2 with one JSON error
// object naming field. It returns stdout+stderr, for leak checks.
func runBadFlags(t *testing.T, env, args []string, field string) string {
	t.Helper()
	cmd := exec.Command(gatewayBin, append([]string{"run"}, args...)...)
	cmd.Env = append(append(os.Environ(), "GATEWAY_DATABASE_URL=", "GATEWAY_SMTP_PASSWORD=", "GATEWAY_TOKENS="), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitBadInput {
		t.Fatalf("gateway run %v: %v, want exit 2; stdout %s stderr %s", args, err, out.String(), errb.String())
	}
	var body struct {
		Error struct {
			Code, Message, Field string
		}
	}
	if err := json.Unmarshal(out.Bytes(), &body); err != nil {
		t.Fatalf("stdout %q is not one JSON object: %v", out.String(), err)
	}
	if body.Error.Code != "invalid_input" || body.Error.Field != field || body.Error.Message == "" {
		t.Fatalf("error = %s; want invalid_input naming field %q", out.String(), field)
	}
	// The message names the flag, not a Go field (a component's error
	// goes through its table, flagFields, emailFields, …).
	if flag := "--" + strings.ReplaceAll(field, "_", "-"); field != "flags" && field != "tokens" && !strings.Contains(body.Error.Message, flag) {
		t.Fatalf("error = %s; want a message naming %s", out.String(), flag)
	}
	return out.String() + errb.String()
}
