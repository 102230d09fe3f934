package cli

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/outbox"
)

// Defaults of the email adapter's flags.
const (
	defaultSMTPAddr = "127.0.0.1:1025"
)

// Mail lookup modes (--mail-lookup).
const (
	mailLookupNone    = "none"
	mailLookupMailpit = "mailpit"
)

// emailAdapter is the email adapter (adapters/email): SMTP with a mail
// policy the intake enforces too.
var emailAdapter = builtinAdapter{kind: email.Kind, flags: newEmailFlags}

type emailFlags struct {
	smtpAddr, smtpTLS, smtpUser, smtpPass, smtpPassFile *string
	smtpInsecure, smtpDedups                            *bool
	smtpMaxSessions                                     *int
	mailDomain, mailFrom, mailRcpt, mailEnvFrom         *string
	mailMaxRcpt                                         *int
	mailLookup, mailpitURL                              *string

	// password is the SMTP password, from --smtp-password or
	// --smtp-password-file (check).
	password string
}

func newEmailFlags(fs *flag.FlagSet) adapterFlags {
	return &emailFlags{
		smtpAddr:        fs.String("smtp-addr", defaultSMTPAddr, "SMTP server host:port of the email adapter"),
		smtpTLS:         fs.String("smtp-starttls", email.StartTLSOpportunistic, "STARTTLS: none, opportunistic or required"),
		smtpUser:        fs.String("smtp-user", "", "SMTP AUTH PLAIN user (default: no AUTH)"),
		smtpPass:        fs.String("smtp-password", "", "SMTP AUTH password (default $GATEWAY_SMTP_PASSWORD; never printed); prefer --smtp-password-file"),
		smtpPassFile:    fs.String("smtp-password-file", "", "file holding the SMTP AUTH password (one line; a warning when group or world can read it)"),
		smtpInsecure:    fs.Bool("smtp-insecure-skip-verify", false, "do not verify the SMTP server's TLS certificate (tests only)"),
		smtpDedups:      fs.Bool("smtp-dedups-on-message-id", false, "the SMTP destination drops a second message with the same Message-ID (lets --unknown-outcome resend resend email)"),
		smtpMaxSessions: fs.Int("smtp-max-sessions", email.DefaultMaxSessions, "SMTP sessions open at once at most (the email adapter's concurrency, below --adapter-concurrency)"),
		mailDomain:      fs.String("mail-domain", email.DefaultDomain, "right-hand side of generated Message-IDs"),
		mailFrom:        fs.String("mail-from-allow", "", "From addresses (exact) or domains (exactly that domain, no subdomains) the email adapter may send as, comma-separated; required to run it"),
		mailRcpt:        fs.String("mail-rcpt-allow", "", "recipient domains (To, Cc, Bcc) allowed, comma-separated (default: any)"),
		mailMaxRcpt:     fs.Int("mail-max-recipients", email.DefaultMaxRecipients, "recipients of one message at most (To+Cc+Bcc, after dedup)"),
		mailEnvFrom:     fs.String("mail-envelope-from", "", "SMTP envelope sender (MAIL FROM), which callers cannot set (default: the payload's From)"),
		mailLookup:      fs.String("mail-lookup", mailLookupNone, "result lookup of sent email: none or mailpit"),
		mailpitURL:      fs.String("mailpit-url", "", "Mailpit's web root for --mail-lookup mailpit, e.g. http://127.0.0.1:8025"),
	}
}

// intake: the mail policy, when any of it is given (its flags were
// checked with the others).
func (f *emailFlags) intake(set func(string) bool) (outbox.KindSpec, bool, error) {
	if !set("mail-from-allow") && !set("mail-rcpt-allow") && !set("mail-max-recipients") {
		return outbox.KindSpec{}, false, nil
	}
	return email.PolicyKindSpec(f.policy()), true, nil
}

// policy is the mail policy the flags give, the adapter's and the
// intake's.
func (f *emailFlags) policy() email.Policy {
	return email.Policy{FromAllow: webhook.SplitList(*f.mailFrom), RcptAllow: webhook.SplitList(*f.mailRcpt),
		MaxRecipients: given(*f.mailMaxRcpt), EnvelopeFrom: *f.mailEnvFrom}
}

// emailFields maps email.Config's fields to the flags that set them.
var emailFields = fieldFlags{
	{path: "Addr", flag: "smtp-addr"},
	{path: "StartTLS", flag: "smtp-starttls"},
	{path: "Password", flag: "smtp-user", msg: "an SMTP password is set (--smtp-password or $GATEWAY_SMTP_PASSWORD) without --smtp-user"},
	{path: "MaxSessions", flag: "smtp-max-sessions"},
	{path: "Domain", flag: "mail-domain"},
	{path: "Lookup.BaseURL", flag: "mailpit-url"},
	{path: "Policy.FromAllow", flag: "mail-from-allow"},
	{path: "Policy.RcptAllow", flag: "mail-rcpt-allow"},
	{path: "Policy.MaxRecipients", flag: "mail-max-recipients"},
	{path: "Policy.EnvelopeFrom", flag: "mail-envelope-from"},
}

// config is the adapter's Config the flags give.
func (f *emailFlags) config(env adapterEnv) email.Config {
	cfg := email.Config{
		Addr:               *f.smtpAddr,
		StartTLS:           *f.smtpTLS,
		Username:           *f.smtpUser,
		Password:           f.password,
		InsecureSkipVerify: *f.smtpInsecure,
		DedupsOnKey:        *f.smtpDedups,
		Domain:             *f.mailDomain,
		MaxSessions:        given(*f.smtpMaxSessions),
		Policy:             f.policy(),
		Logger:             env.log,
	}
	if *f.mailLookup == mailLookupMailpit {
		cfg.Lookup = &email.MailpitLookup{BaseURL: strings.TrimRight(*f.mailpitURL, "/")}
	}
	return cfg
}

// check reads the password file, checks the flags the adapter's Config
// does not hold, and checks the Config with the adapter's own rules
// (email.Config.Validate).
func (f *emailFlags) check(env adapterEnv, runs bool) error {
	f.password = *f.smtpPass
	if *f.smtpPassFile != "" {
		if f.password != "" {
			return badInput("smtp_password_file", "--smtp-password-file and --smtp-password (or $GATEWAY_SMTP_PASSWORD) are both set: give one")
		}
		p, err := readSecretFile(*f.smtpPassFile, env.log)
		if err != nil {
			return badInput("smtp_password_file", "--smtp-password-file: "+oneLine(err.Error()))
		}
		f.password = p
	}
	switch *f.mailLookup {
	case "", mailLookupNone:
	case mailLookupMailpit:
		if *f.mailpitURL == "" {
			return badInput("mailpit_url", "--mail-lookup mailpit needs --mailpit-url, e.g. http://127.0.0.1:8025")
		}
	default:
		return badInput("mail_lookup", fmt.Sprintf("--mail-lookup must be none or mailpit, got %q", *f.mailLookup))
	}
	cfg := f.config(env)
	if cfg.Lookup == nil && *f.mailpitURL != "" {
		// Given but not used (--mail-lookup none): still checked.
		cfg.Lookup = &email.MailpitLookup{BaseURL: *f.mailpitURL}
	}
	if !runs {
		// Only a running adapter needs an address: a stand-in for none
		// keeps the other flags checked.
		cfg.Addr = cmp.Or(cfg.Addr, defaultSMTPAddr)
	}
	// The sender allow-list is required, but checked last (checkLast):
	// the adapter runs by default, and its missing allow-list must not
	// hide a bad flag given.
	cfg.Policy.AnyFrom = len(cfg.Policy.FromAllow) == 0
	return emailFields.flagError(cfg.Validate())
}

func (f *emailFlags) checkLast(env adapterEnv, runs bool) error {
	if !runs {
		return nil
	}
	return emailFields.flagError(f.config(env).Validate())
}

func (f *emailFlags) registration(_ context.Context, env adapterEnv) (adapters.Registration, error) {
	cfg := f.config(env)
	e, err := email.New(cfg)
	if err != nil {
		return adapters.Registration{}, emailFields.flagError(err)
	}
	if cfg.Lookup == nil && !(cfg.DedupsOnKey && env.unknown == executor.UnknownResend) {
		env.log.Warn("gateway: email has no result lookup: an attempt whose outcome is lost is held as unknown for an operator (see --mail-lookup)",
			"component", "gateway")
	}
	return e.Registration(), nil
}
