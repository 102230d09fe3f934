package email

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/emailkind"
	"github.com/fencegate/fencegate/outbox"
)

// Kind is the intent kind this adapter serves.
const Kind = emailkind.Name

// Defaults of Config.
const (
	DefaultDomain    = "fencegate.local"
	DefaultTimeout   = 30 * time.Second
	DefaultLocalName = "localhost"
	// DefaultMaxSessions is Config.MaxSessions' default: SMTP servers
	// limit the sessions one client may hold open (often 10-20 per
	// address); the runtime's own default concurrency is far higher.
	DefaultMaxSessions = 16
)

// STARTTLS modes of Config.StartTLS.
const (
	// StartTLSNone never upgrades the connection.
	StartTLSNone = "none"
	// StartTLSOpportunistic upgrades when the server offers STARTTLS.
	StartTLSOpportunistic = "opportunistic"
	// StartTLSRequired refuses to send unless the connection is upgraded.
	StartTLSRequired = "required"
)

// ErrLookupUnavailable is returned by Adapter.Lookup when no Lookup is
// configured: the destination cannot be asked whether a message arrived.
var ErrLookupUnavailable = errors.New("email: result lookup is unavailable (no lookup configured)")

// Lookup finds a sent message at the destination by its Message-ID.
type Lookup interface {
	// Find reports whether a message whose Message-ID is exactly messageID
	// (given with angle brackets) is at the destination, with details to
	// record. An error means the destination could not be asked.
	Find(ctx context.Context, messageID string) (found bool, info map[string]any, err error)
}

// Config configures an Adapter.
type Config struct {
	// Addr is the SMTP server's host:port. Required.
	Addr string
	// Domain is the right-hand side of generated Message-IDs.
	// Default DefaultDomain ("fencegate.local").
	Domain string
	// LocalName is the host name sent in EHLO. Default "localhost".
	LocalName string
	// StartTLS is "none", "opportunistic" or "required".
	// Default "opportunistic".
	StartTLS string
	// Username and Password enable AUTH PLAIN when Username is set. The
	// password is only sent over TLS or to a loopback address (net/smtp's
	// rule); otherwise every send fails permanently. Default: no AUTH.
	Username, Password string
	// InsecureSkipVerify disables TLS certificate verification. For tests
	// only. Default false.
	InsecureSkipVerify bool
	// Timeout bounds one whole attempt, from dial to the final reply.
	// Default 30s.
	Timeout time.Duration
	// MaxSessions bounds the SMTP sessions open at once (declared to the
	// runtime as Capabilities.Concurrency). Default DefaultMaxSessions.
	MaxSessions int
	// Lookup enables result lookup (Adapter.Lookup). Default nil: none.
	Lookup Lookup
	// LookupSettle is how long after an attempt's last I/O with the SMTP
	// server a Lookup that finds nothing is trusted as proof that the
	// message was not taken (a relay may store a message long after the
	// final dot). Default 0: the runtime's Config.LookupSettle.
	LookupSettle time.Duration
	// DedupsOnKey says the destination drops a second message with the
	// same Message-ID, so an attempt with an unknown outcome may simply be
	// sent again. Default false (plain SMTP and Mailpit do not; Mailpit
	// does with --ignore-duplicate-ids).
	DedupsOnKey bool
	// Policy is what may be sent (allowed senders and recipient domains,
	// a recipient limit, the envelope sender); checked at execute, and at
	// the gateway's intake through KindSpec.
	Policy Policy
	// Logger receives debug logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock for Date headers and sent_at. Default time.Now.
	Now func() time.Time
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.Domain = cmp.Or(c.Domain, DefaultDomain)
	c.LocalName = cmp.Or(c.LocalName, DefaultLocalName)
	c.StartTLS = cmp.Or(c.StartTLS, StartTLSOpportunistic)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.MaxSessions = cmp.Or(c.MaxSessions, DefaultMaxSessions)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate checks c, its defaults applied, connecting to nothing. An error
// is a *fenceerr.InvalidError naming the field (Addr, MaxSessions,
// Policy.FromAllow, Lookup.BaseURL, …).
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	host, port, err := net.SplitHostPort(c.Addr)
	switch {
	case err != nil || host == "" || port == "":
		return fenceerr.Invalid("Addr", "must be host:port, got %q", c.Addr)
	case c.StartTLS != StartTLSNone && c.StartTLS != StartTLSOpportunistic && c.StartTLS != StartTLSRequired:
		return fenceerr.Invalid("StartTLS", "must be %q, %q or %q, got %q",
			StartTLSNone, StartTLSOpportunistic, StartTLSRequired, c.StartTLS)
	case c.Password != "" && c.Username == "":
		return fenceerr.Invalid("Password", "is set without Username")
	case c.LookupSettle < 0:
		return fenceerr.Invalid("LookupSettle", "must not be negative, got %s", c.LookupSettle)
	case c.Timeout < 0:
		return fenceerr.Invalid("Timeout", "must not be negative, got %s", c.Timeout)
	case c.MaxSessions < 1:
		return fenceerr.Invalid("MaxSessions", "must be at least 1")
	case strings.ContainsAny(c.Domain, "<>@ \t\r\n"):
		return fenceerr.Invalid("Domain", "%q is not a valid Message-ID domain", c.Domain)
	case strings.ContainsAny(c.LocalName, " \t\r\n"):
		return fenceerr.Invalid("LocalName", "%q is not a valid host name", c.LocalName)
	}
	if m, ok := c.Lookup.(*MailpitLookup); ok {
		if err := fenceerr.Within("Lookup", m.check()); err != nil {
			return err
		}
	}
	if err := fenceerr.Within("Policy", c.Policy.CheckConfig()); err != nil {
		return err
	}
	// Without a sender allow-list the intake is an open mail relay for
	// anyone with a worker token: none only when said on purpose.
	if len(c.Policy.FromAllow) == 0 && !c.Policy.AnyFrom {
		return fenceerr.Invalid("Policy.FromAllow", "is required: the From addresses or domains the adapter may send as")
	}
	return nil
}

// Adapter sends email intents over SMTP.
type Adapter struct {
	cfg    Config
	host   string
	logger *slog.Logger
}

var (
	_ adapters.Executor = (*Adapter)(nil)
	_ adapters.Looker   = (*Adapter)(nil)
)

// New returns an Adapter for cfg (after WithDefaults).
func New(cfg Config) (*Adapter, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(cfg.Addr)
	return &Adapter{cfg: cfg, host: host, logger: cfg.Logger.With("component", "email")}, nil
}

// Kind returns "email".
func (a *Adapter) Kind() string { return Kind }

// Registration is the adapter as gateway.Config.Adapters takes it: the
// email kind, its intake rules with the mail policy (KindSpec: mail
// outside the policy is refused at enqueue, naming the field) and the
// adapter as its executor.
func (a *Adapter) Registration() adapters.Registration {
	return adapters.Registration{Kind: Kind, Spec: a.KindSpec(), Executor: a}
}

// Capabilities declares the destination's: Lookup when Config.Lookup is
// set (Mailpit's search by Message-ID), DedupsOnKey as configured (a
// destination that drops a second message with the same Message-ID),
// Config.LookupSettle (zero: the runtime's) and Config.MaxSessions as its
// concurrency.
func (a *Adapter) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lookup: a.cfg.Lookup != nil, DedupsOnKey: a.cfg.DedupsOnKey,
		LookupSettle: max(a.cfg.LookupSettle, 0), Concurrency: a.cfg.MaxSessions}
}

// MessageID returns the Message-ID this adapter sends for an idempotency
// key.
func (a *Adapter) MessageID(key string) string { return MessageID(key, a.cfg.Domain) }

// Result is the JSON object recorded for a sent message.
type Result struct {
	MessageID    string    `json:"message_id"`
	SMTPResponse string    `json:"smtp_response"`
	Recipients   []string  `json:"recipients"`
	SentAt       time.Time `json:"sent_at"`
}

// Execute sends req's message once. See the package documentation for how
// failures are classified.
func (a *Adapter) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	if req.IdempotencyKey == "" {
		return adapters.Outcome{}, adapters.PermanentError(errors.New("email: intent has no idempotency key"))
	}
	p, env, err := parsePayload(req.Payload)
	if err != nil {
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("email: %w", err))
	}
	// The policy again at execute: an intent that reached the outbox
	// another way (a Go worker, the CLI, SQL) is held to it too; nothing
	// is sent.
	if err := a.cfg.Policy.Check(p); err != nil {
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("email: not allowed by the mail policy: %w", err))
	}
	if a.cfg.Policy.EnvelopeFrom != "" {
		env.From, _ = emailkind.Address(a.cfg.Policy.EnvelopeFrom)
	}
	id := a.MessageID(req.IdempotencyKey)
	data, err := compose(p, headerInfo{
		MessageID: id,
		Key:       req.IdempotencyKey,
		IntentID:  req.IntentID,
		Epoch:     req.Epoch,
		Date:      a.cfg.Now(),
	})
	if err != nil {
		return adapters.Outcome{}, adapters.PermanentError(fmt.Errorf("email: %w", err))
	}

	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	reply, err := a.send(ctx, env, data, req.StillOwner)
	if err != nil {
		a.logger.DebugContext(ctx, "email send failed", "intent_id", req.IntentID,
			"message_id", id, "attempt", req.Attempt, "error", err)
		return adapters.Outcome{}, err
	}
	a.logger.DebugContext(ctx, "email sent", "intent_id", req.IntentID,
		"message_id", id, "attempt", req.Attempt, "smtp_response", reply)
	res, err := json.Marshal(Result{
		MessageID:    id,
		SMTPResponse: reply,
		Recipients:   env.Recipients,
		SentAt:       a.cfg.Now().UTC(), // when the server accepted it
	})
	if err != nil {
		// The message is out; failing here would invite a second send.
		return adapters.Outcome{}, adapters.UnknownError(fmt.Errorf("email: encode result after send: %w", err))
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: res}, nil
}

// Lookup asks the configured Lookup whether the message for req's
// idempotency key arrived. Without one it returns ErrLookupUnavailable
// (Capabilities declares Lookup only with one). A failure to ask is
// retryable.
func (a *Adapter) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	if a.cfg.Lookup == nil {
		return adapters.Outcome{}, false, ErrLookupUnavailable
	}
	id := a.MessageID(req.IdempotencyKey)
	found, info, err := a.cfg.Lookup.Find(ctx, id)
	if err != nil {
		return adapters.Outcome{}, false, adapters.RetryableError(fmt.Errorf("email: look up %s: %w", id, err))
	}
	if !found {
		return adapters.Outcome{}, false, nil
	}
	res := make(map[string]any, len(info)+2)
	for k, v := range info {
		res[k] = v
	}
	// Set last: the lookup's details never overwrite these.
	res["message_id"] = id
	res["found_by"] = "lookup"
	b, err := json.Marshal(res)
	if err != nil {
		return adapters.Outcome{}, false, fmt.Errorf("email: encode lookup result: %w", err)
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: b}, true, nil
}
