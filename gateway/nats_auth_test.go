package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/faulttest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/testkit/testpki"
)

// The gateway authenticates to a NATS server that requires TLS with a
// client certificate and an NKey: with --nats-tls-ca, --nats-tls-cert,
// --nats-tls-key and --nats-nkey it relays (readyz: nats ok); without the
// NKey it is refused and says so (readyz: nats unavailable). Bad files are
// bad input naming the flag.
func TestNATSAuthTLSAndNKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, srvCert, srvKey, cliCert, cliKey, pool := testpki.Write(t, dir)
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	seedFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	srvPair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.StartWith(t, func(o *server.Options) {
		o.TLS, o.TLSVerify = true, true
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{srvPair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	})
	url := strings.Replace(ns.URL, "nats://", "tls://", 1)
	pg := testdb.New(t)
	good := NATSAuth{NKeyFile: seedFile, TLSCAFile: ca, TLSCertFile: cliCert, TLSKeyFile: cliKey}

	g, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pg, NATSURL: url, NATSAuth: good, RunDispatcher: true, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	deadline := time.Now().Add(20 * time.Second)
	for p := getProbe(t, g.MetricsAddr(), "/readyz"); p.Checks["nats"] != "ok" || p.Checks["stream"] != "ok"; p = getProbe(t, g.MetricsAddr(), "/readyz") {
		if time.Now().After(deadline) {
			t.Fatalf("with TLS and the NKey: /readyz %+v, want nats and stream ok", p)
		}
		time.Sleep(20 * time.Millisecond)
	}

	noKey := good
	noKey.NKeyFile = ""
	var logs faulttest.SyncBuffer
	bad, err := Start(context.Background(), Config{Schema: testdb.Schema(), Pool: pg, NATSURL: url, NATSAuth: noKey, RunDispatcher: true, MetricsAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Stop()
	for !strings.Contains(strings.ToLower(logs.String()), "authorization violation") {
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("without the NKey: no refusal logged:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := getProbe(t, bad.MetricsAddr(), "/readyz"); p.Checks["nats"] == "ok" {
		t.Fatalf("without the NKey: /readyz %+v, want nats unavailable", p)
	}

	// A credentials file that holds no JWT and seed (a seed alone, a
	// corrupt file) is refused at start: it was taken, and the connection
	// then failed for ever ("nkeys: invalid checksum").
	corrupt := filepath.Join(dir, "corrupt.creds")
	if err := os.WriteFile(corrupt, []byte("-----BEGIN NATS USER JWT-----\nnot a jwt\n------END NATS USER JWT------\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field string
		a     NATSAuth
	}{
		{"NATSAuth.NKeyFile", NATSAuth{NKeyFile: filepath.Join(dir, "missing")}},
		{"NATSAuth.TLSCAFile", NATSAuth{TLSCAFile: filepath.Join(dir, "missing")}},
		{"NATSAuth.TLSCertFile", NATSAuth{TLSCertFile: cliCert}},
		{"NATSAuth.CredsFile", NATSAuth{CredsFile: seedFile, NKeyFile: seedFile}},
		{"NATSAuth.CredsFile", NATSAuth{CredsFile: seedFile}},
		{"NATSAuth.CredsFile", NATSAuth{CredsFile: corrupt}},
	} {
		_, err := New(pg, nil, Config{Schema: testdb.Schema(), NATSURL: url, NATSAuth: c.a, Dispatcher: &dispatcher.Config{}})
		var me *fenceerr.InvalidError
		if !errors.As(err, &me) || me.Field != c.field {
			t.Errorf("New with %+v: %v, want bad input naming %s", c.a, err, c.field)
		}
	}
}

// A well-formed credentials file (a user JWT signed by its account, and the
// user's seed, as nsc writes it) passes the check at start; the check
// refuses only files that are not credentials (above).
func TestNATSCredsFileAccepted(t *testing.T) {
	t.Parallel()
	account, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	useed, _ := user.Seed()
	claims := jwt.NewUserClaims(upub)
	token, err := claims.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(token, useed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "user.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := NATSAuth{CredsFile: path}.options()
	if err != nil || len(opts) != 1 {
		t.Fatalf("a credentials file nsc would write: %d options, %v", len(opts), err)
	}
}
