package cli

import (
	"encoding/base64"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// expectProbeFailure checks a failed probe: exit code, the error object on
// stdout, and one line on stderr holding each of want.
func expectProbeFailure(t *testing.T, r cliResult, code int, errCode string, want ...string) {
	t.Helper()
	expectCode(t, r, code, errCode)
	line := strings.TrimSuffix(r.stderr, "\n")
	if line == "" || strings.Contains(line, "\n") {
		t.Fatalf("stderr is not one line: %q", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("stderr %q lacks %q", line, w)
		}
	}
}

// gateway probe against real HTTP servers (httptest: the destination is
// the edge of the world here): 2xx is exit 0, and every other answer or
// non-answer is exit 1 with one line on stderr saying why.
func TestProbeAnswers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/down", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"unavailable","checks":{"nats":"not connected"}}` + "\n" + strings.Repeat("x", 2000)))
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close

	r := gw(t, "", "probe", srv.URL+"/ok")
	expectCode(t, r, 0, "")
	if r.obj["status"] != float64(204) || r.obj["url"] != srv.URL+"/ok" || r.stderr != "" {
		t.Errorf("probe /ok: %s stderr %q", r.stdout, r.stderr)
	}
	// Flags after the URL, as a healthcheck line may have them.
	expectCode(t, gw(t, "", "probe", srv.URL+"/ok", "--timeout", "3s"), 0, "")

	expectProbeFailure(t, gw(t, "", "probe", srv.URL+"/down"), 1, "unavailable",
		"503 Service Unavailable", `"nats":"not connected"`, "…")
	expectProbeFailure(t, gw(t, "", "probe", srv.URL+"/moved"), 1, "unavailable", "302 Found to /ok (not followed)")

	start := time.Now()
	expectProbeFailure(t, gw(t, "", "probe", "--timeout", "300ms", srv.URL+"/hang"), 1, "unavailable", "no answer within 300ms")
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a 300ms probe took %s", d)
	}

	// Nothing listening: the refused connection is the reason.
	closed := httptest.NewServer(http.NotFoundHandler())
	dead := closed.URL
	closed.Close()
	expectProbeFailure(t, gw(t, "", "probe", dead+"/healthz"), 1, "unavailable", "connection refused")

	expectProbeFailure(t, gw(t, "", "probe"), 2, "invalid_input", "needs a URL")
	expectProbeFailure(t, gw(t, "", "probe", "ftp://127.0.0.1/x"), 2, "invalid_input", "not an http:// or https:// URL")
	expectProbeFailure(t, gw(t, "", "probe", "127.0.0.1:9090/healthz"), 2, "invalid_input", "not an http:// or https:// URL")
	expectProbeFailure(t, gw(t, "", "probe", srv.URL, "extra"), 2, "invalid_input", `unexpected argument "extra"`)
	expectProbeFailure(t, gw(t, "", "probe", "--timeout", "0s", srv.URL), 2, "invalid_input", "--timeout must be positive")
}

// An https URL is verified: the server's own certificate given as
// --tls-ca passes, the system's roots do not know it.
func TestProbeHTTPS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "server.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	expectProbeFailure(t, gw(t, "", "probe", srv.URL+"/healthz"), 1, "unavailable", "certificate")
	r := gw(t, "", "probe", "--tls-ca", ca, srv.URL+"/healthz")
	expectCode(t, r, 0, "")
	if r.obj["status"] != float64(200) {
		t.Errorf("probe over https: %s", r.stdout)
	}
	notPEM := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(notPEM, []byte("nothing"), 0o600); err != nil {
		t.Fatal(err)
	}
	expectProbeFailure(t, gw(t, "", "probe", "--tls-ca", notPEM, srv.URL), 2, "invalid_input", "holds no PEM certificate")
}

// The healthcheck the compose file and the Kubernetes manifests use:
// gateway probe on `gateway run`'s metrics address, /healthz (liveness)
// and /readyz (PostgreSQL, NATS, the stream, the relay), then nothing
// once the process has stopped.
func TestProbeGatewayRun(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	p := newRunEnv(t).run(t, nil, "--adapters", "", "--metrics-addr", addr)
	base := "http://" + addr
	pollUntil(t, 30*time.Second, "gateway probe "+base+"/readyz to exit 0", func() (bool, string) {
		r := gw(t, "", "probe", "--timeout", "5s", base+"/readyz")
		return r.code == 0, r.stderr
	})
	r := gw(t, "", "probe", base+"/healthz")
	expectCode(t, r, 0, "")
	if r.obj["status"] != float64(200) {
		t.Errorf("probe /healthz: %s", r.stdout)
	}
	p.stop(t)
	expectProbeFailure(t, gw(t, "", "probe", base+"/healthz"), 1, "unavailable", "connection refused")
}

// gateway probe never prints a URL's credentials, on stdout or stderr, in
// success or failure (docs/operations.md: every URL in any output is shown
// without its password, also ?password=-style parameters): the userinfo
// password, secret query parameters, a redirect's Location, and the text
// of a URL it refuses (which is never echoed raw: a URL that does not
// parse may split a password anywhere).
func TestProbeHidesURLCredentials(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/down", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://u:PWLOC1@127.0.0.1/ok?token=PWLOC2", http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	closed := httptest.NewServer(http.NotFoundHandler())
	dead := closed.URL
	closed.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	cases := []struct {
		url     string
		code    int
		errCode string
		secrets []string
		shows   string // on stdout or stderr: the URL, redacted
	}{
		{"http://u:PWOK1@" + host + "/ok?password=PWOK2&api_key=PWOK3&n=1", 0, "", []string{"PWOK1", "PWOK2", "PWOK3"}, "/ok?api_key=xxxxx&n=1&password=xxxxx"},
		{srv.URL + "/ok?password=PWBAD%zz&n=2", 0, "", []string{"PWBAD"}, "/ok?n=2"},
		{srv.URL + "/down?password=PWDOWN", 1, "unavailable", []string{"PWDOWN"}, "/down?password=xxxxx"},
		{srv.URL + "/moved?token=PWMOVED", 1, "unavailable", []string{"PWMOVED", "PWLOC1", "PWLOC2"}, "not followed"},
		{dead + "/x?password=PW1", 1, "unavailable", []string{"PW1"}, "connection refused"},
		{"ftp://u:PWFTP@127.0.0.1/", 2, "invalid_input", []string{"PWFTP"}, "not an http:// or https:// URL"},
		{"http://u:PW/BAD@127.0.0.1/", 2, "invalid_input", []string{"PW/BAD", "PW"}, "not an http:// or https:// URL"},
		{"http://127.0.0.1:x/?password=PWPORT", 2, "invalid_input", []string{"PWPORT"}, "not an http:// or https:// URL"},
	}
	for i, tc := range cases {
		r := gw(t, "", "probe", "--timeout", "3s", tc.url)
		expectCode(t, r, tc.code, tc.errCode)
		out := r.stdout + r.stderr
		for _, s := range tc.secrets {
			if strings.Contains(out, s) {
				t.Errorf("case %d: probe prints %s: stdout %s stderr %s", i, s, r.stdout, r.stderr)
			}
		}
		if !strings.Contains(out, tc.shows) {
			t.Errorf("case %d: stdout %s stderr %s, want %q", i, r.stdout, r.stderr, tc.shows)
		}
	}
	t.Logf("checked %d URLs", len(cases))
	if len(cases) == 0 {
		t.Fatal("no URL checked")
	}
}

// A non-2xx answer is exit 1 with the error object, which still says the
// status (numeric) and the URL, as the success object does: a healthcheck
// reading the JSON tells a 503 from no answer.
func TestProbeNon2xxSaysStatus(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("/down", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	mux.HandleFunc("/gone", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cases := map[string]int{"/down": 503, "/gone": 404, "/moved": 302}
	for path, status := range cases {
		r := gw(t, "", "probe", srv.URL+path)
		expectCode(t, r, 1, "unavailable")
		e := r.obj["error"].(map[string]any)
		if e["status"] != float64(status) || e["url"] != srv.URL+path {
			t.Errorf("probe %s: error object %s, want status %d and url %s", path, r.stdout, status, srv.URL+path)
		}
	}
	t.Logf("checked %d answers", len(cases))
	if len(cases) == 0 {
		t.Fatal("no answer checked")
	}
}

// A failing answer's body is quoted, but never the credentials the probe
// sent that the body quotes back (an echo service, a "bad credentials"
// page): the URL's password, as given and inside the Authorization: Basic
// header Go's client makes of it, and its query's secret values.
func TestProbeBodyEchoHidesCredentials(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		user, pass, _ := r.BasicAuth()
		_, _ = w.Write([]byte(`{"authorization":"` + r.Header.Get("Authorization") + `","user":"` + user + `","password":"` + pass +
			`","uri":"` + r.URL.RequestURI() + `"}`))
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	secrets := []string{"PWECHO-9kQz", base64.StdEncoding.EncodeToString([]byte("svc:PWECHO-9kQz")), "TOKECHO-77xq"}
	r := gw(t, "", "probe", "--timeout", "3s", "http://svc:PWECHO-9kQz@"+host+"/echo?token=TOKECHO-77xq&n=1")
	expectProbeFailure(t, r, 1, "unavailable", "401", `"user":"svc"`, "[redacted]")
	for _, s := range secrets {
		if strings.Contains(r.stdout+r.stderr, s) {
			t.Errorf("probe prints %s: stdout %s stderr %s", s, r.stdout, r.stderr)
		}
	}
}
