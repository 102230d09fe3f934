package gateway

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/outagelog"
)

// DefaultNATSURL is dialled when Config has neither NC nor NATSURL.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// DefaultNATSPingInterval is how often the connection Start dials pings
// its server when Config.NATSPingInterval is zero. A server that answers
// neither of two pings is left for another of the seed URLs: a hung server
// (a paused process, a frozen VM, a partition that drops packets instead
// of resetting the connection) keeps the socket open, and only the pings
// tell. With nats.go's own default (2 minutes) the relay and the adapters
// on such a server stalled as long as it hung, up to 6 minutes
// (test/cluster); with 2 s they leave it within 4 to 6 s, about when the
// cluster has elected new leaders for what it led (raft election timeout 4
// to 9 s).
const DefaultNATSPingInterval = 2 * time.Second

// NATSAuth is how the gateway authenticates to NATS: a credentials file
// (JWT and seed), or an NKey seed file; and TLS with a CA to verify the
// server and a client certificate. Zero: none (a tls:// URL still verifies
// the server against the system's roots).
type NATSAuth struct {
	CredsFile   string
	NKeyFile    string
	TLSCAFile   string
	TLSCertFile string
	TLSKeyFile  string
}

// options checks the files and returns the connection options; an error
// is a *fenceerr.InvalidError naming the field ("NATSAuth.NKeyFile").
func (a NATSAuth) options() ([]nats.Option, error) {
	var opts []nats.Option
	readable := func(field, path string) error {
		f, err := os.Open(path)
		if err != nil {
			return invalid("NATSAuth."+field, "cannot read %s: %s", path, errmap.OneLine(err.Error()))
		}
		return f.Close()
	}
	if a.CredsFile != "" && a.NKeyFile != "" {
		return nil, invalid("NATSAuth.CredsFile", "and NATSAuth.NKeyFile exclude each other: give one")
	}
	if a.CredsFile != "" {
		if err := readable("CredsFile", a.CredsFile); err != nil {
			return nil, err
		}
		// nats.go reads the file at each connection attempt: a file that
		// holds no JWT and seed would fail every attempt for ever
		// ("nkeys: invalid checksum"), the process running disconnected.
		// Checked once here; the message may not quote the file.
		b, err := os.ReadFile(a.CredsFile)
		if err == nil {
			// ParseDecoratedJWT takes an undecorated file whole: a JWT has
			// three dot-separated parts, a seed none.
			if jwt, jerr := nkeys.ParseDecoratedJWT(b); jerr != nil {
				err = jerr
			} else if parts := strings.Split(strings.TrimSpace(jwt), "."); len(parts) != 3 || slices.Contains(parts, "") {
				err = errors.New("no user JWT")
			} else {
				_, err = nkeys.ParseDecoratedNKey(b)
			}
		}
		if err != nil {
			return nil, invalid("NATSAuth.CredsFile", "%s does not hold NATS credentials (a user JWT and its NKey seed)", a.CredsFile)
		}
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if a.NKeyFile != "" {
		if err := readable("NKeyFile", a.NKeyFile); err != nil {
			return nil, err
		}
		o, err := nats.NkeyOptionFromSeed(a.NKeyFile)
		if err != nil {
			// The message may quote the file: say only that it is not a seed.
			return nil, invalid("NATSAuth.NKeyFile", "%s does not hold an NKey seed", a.NKeyFile)
		}
		opts = append(opts, o)
	}
	if a.TLSCAFile != "" {
		if err := readable("TLSCAFile", a.TLSCAFile); err != nil {
			return nil, err
		}
		opts = append(opts, nats.RootCAs(a.TLSCAFile))
	}
	if (a.TLSCertFile == "") != (a.TLSKeyFile == "") {
		return nil, invalid("NATSAuth.TLSCertFile", "and NATSAuth.TLSKeyFile go together")
	}
	if a.TLSCertFile != "" {
		for field, p := range map[string]string{"TLSCertFile": a.TLSCertFile, "TLSKeyFile": a.TLSKeyFile} {
			if err := readable(field, p); err != nil {
				return nil, err
			}
		}
		opts = append(opts, nats.ClientCert(a.TLSCertFile, a.TLSKeyFile))
	}
	return opts, nil
}

// checkNATSURL checks NATSURL's comma-separated seeds: each a host:port or
// a URL with a scheme nats.go dials (nats, tls, ws, wss). Another scheme
// (http://…) was accepted, and the gateway then started and stayed
// disconnected, retrying for ever without a word of why. The error names
// NATSURL and never echoes the URL (it may hold a password).
//
// A seed without a scheme is checked as nats.go dials it, nats://seed: it
// was not, and nats.go's parse error quoted it, password included. An '@'
// past the host (in the path, query or fragment) is refused: it is where
// a password with an unencoded '/' leaves its tail, shown whole by the
// redacted URL (redaction hides the user info only).
func checkNATSURL(s string) error {
	for i, seed := range strings.Split(s, ",") {
		seed = strings.TrimSpace(seed)
		if seed == "" {
			return invalid("NATSURL", "seed %d is empty", i+1)
		}
		if !strings.Contains(seed, "://") {
			seed = "nats://" + seed // host:port, dialled as nats://host:port
		}
		u, err := url.Parse(seed)
		if err != nil {
			return invalid("NATSURL", "seed %d is not a URL (percent-encode '%%', '@', '/', ':' in a user name or password; the seed is not shown)", i+1)
		}
		_, rest, _ := strings.Cut(seed, "://")
		if end := strings.IndexAny(rest, "/?#"); end >= 0 && strings.Contains(rest[end:], "@") {
			return invalid("NATSURL", "seed %d has an '@' after its host: percent-encode '@' and '/' in a user name or password (the seed is not shown)", i+1)
		}
		switch strings.ToLower(u.Scheme) {
		case "nats", "tls", "ws", "wss":
		default:
			return invalid("NATSURL", "seed %d has scheme %q; NATS is dialled with nats://, tls://, ws:// or wss://", i+1, u.Scheme)
		}
		if u.Host == "" {
			return invalid("NATSURL", "seed %d names no host", i+1)
		}
	}
	return nil
}

// connectNATS takes Config.NC, or dials Config.NATSURL: a part the
// gateway closes at Stop.
func (s *Gateway) connectNATS(cfg Config, log *slog.Logger) error {
	s.nc = cfg.NC
	if s.nc != nil {
		return nil
	}
	nc, err := dialNATS(cmp.Or(cfg.NATSURL, DefaultNATSURL), cfg.NATSAuth, cmp.Or(cfg.NATSPingInterval, DefaultNATSPingInterval), s.ns.InboxPrefix(), log)
	if errors.Is(err, fenceerr.ErrInvalid) {
		return err
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		// Not expected (checkNATSURL parses every seed as nats.go does),
		// but its text would quote the URL.
		return invalid("NATSURL", "cannot be used: a seed is not a URL (not shown)")
	}
	if err != nil {
		return invalid("NATSURL", "cannot be used: %s", errmap.OneLine(err.Error()))
	}
	s.nc = nc
	s.parts.Add("nats", nc.Close, nil)
	return nil
}

// dialNATS connects to NATS, waiting for a server that is down at start
// like one that goes away later. inbox prefixes the connection's inboxes
// (wire.Namespace.InboxPrefix; empty: nats.go's _INBOX), so that the
// deployment's NATS users need subscribe permission on that prefix only.
func dialNATS(natsURL string, auth NATSAuth, ping time.Duration, inbox string, log *slog.Logger) (*nats.Conn, error) {
	authOpts, err := auth.options()
	if err != nil {
		return nil, err
	}
	if inbox != "" {
		authOpts = append(authOpts, nats.CustomInboxPrefix(inbox))
	}
	failed := &attemptLog{log: log}
	return nats.Connect(natsURL, append(authOpts,
		nats.Name("fencegate-gateway"),
		// A NATS server that is down at start is waited for like one that
		// goes away later: the dispatcher backs off until it is back.
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// No client-side buffering while disconnected: a publish fails at
		// once, its claim is returned, and the dispatcher backs off,
		// instead of a buffered message going out long after its claim
		// expired.
		nats.ReconnectBufSize(-1),
		// A server that answers no ping is left like one that closed the
		// connection (see DefaultNATSPingInterval); natsURL's other seeds
		// (comma-separated) and the servers the cluster announces are
		// tried in turn.
		nats.PingInterval(ping),
		nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if err == nil && c.IsClosed() {
				return // the gateway's own Close, at stop: nothing went wrong
			}
			log.Warn("gateway: NATS disconnected", "component", "gateway", "error", err)
		}),
		// The first connection after a start that had to retry is a
		// connect, not a reconnect (nats.go calls ConnectedCB then): the
		// attempts of that wait end there too, so that the next outage's
		// first failed attempt is said at WARN again.
		nats.ConnectHandler(func(*nats.Conn) { failed.reset() }),
		nats.ReconnectHandler(func(c *nats.Conn) {
			failed.reset()
			log.Info("gateway: NATS reconnected", "component", "gateway", "url", c.ConnectedUrlRedacted())
		}),
		// A refused connection (bad credentials, a TLS failure) is said,
		// not only retried in silence: once, and again when the reason
		// changes, not at every attempt (one a second for the whole
		// outage).
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { failed.failed(err) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("gateway: NATS error", "component", "gateway", "error", err)
		}),
	)...)
}

// attemptLog says a failed NATS connection attempt at WARN when it is the
// first of an outage or its reason changed, at DEBUG while it repeats
// (outagelog): one a second for a whole outage otherwise.
type attemptLog struct {
	log   *slog.Logger
	state outagelog.State
}

func (a *attemptLog) failed(err error) {
	level, n := a.state.Failed(err.Error())
	msg := "gateway: NATS connection attempt failed"
	if level == slog.LevelWarn {
		msg += "; retrying every second (said again when the reason changes)"
	}
	a.log.Log(context.Background(), level, msg, "component", "gateway", "error", err, "attempts", n)
}

func (a *attemptLog) reset() { a.state.Recovered() }
