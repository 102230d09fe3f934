package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/smtp"
	"net/textproto"
	"regexp"
	"time"

	"github.com/fencegate/fencegate/adapters"
)

// Phase is a step of the SMTP transaction.
type Phase string

// Phases of an SMTP transaction, in order.
const (
	PhaseDial     Phase = "dial"
	PhaseGreeting Phase = "greeting"
	PhaseHello    Phase = "ehlo"
	PhaseStartTLS Phase = "starttls"
	PhaseAuth     Phase = "auth"
	PhaseMail     Phase = "mail"
	PhaseRcpt     Phase = "rcpt"
	// PhaseData is the DATA command and its 354 reply.
	PhaseData Phase = "data"
	// PhaseBody is writing the message and the end-of-data marker.
	PhaseBody Phase = "body"
	// PhaseFinalReply is waiting for the reply to the end-of-data marker.
	PhaseFinalReply Phase = "final-reply"
)

// PhaseError is an SMTP attempt's failure: where it happened and the
// server's reply code, if the server replied.
type PhaseError struct {
	Phase Phase
	// Code is the SMTP reply code, 0 when there was no reply (network error,
	// timeout, local refusal).
	Code int
	Err  error
}

func (e *PhaseError) Error() string {
	if e.Code != 0 {
		return fmt.Sprintf("smtp %s: reply %d: %v", e.Phase, e.Code, e.Err)
	}
	return fmt.Sprintf("smtp %s: %v", e.Phase, e.Err)
}

func (e *PhaseError) Unwrap() error { return e.Err }

// classify turns a failure in phase p into an adapters error. Only
// PhaseFinalReply can be unknown: before it the server has not received the
// complete message, so it cannot have accepted it.
func classify(ctx context.Context, p Phase, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		// Say why the I/O was cut short (timeout or shutdown).
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	pe := &PhaseError{Phase: p, Err: err}
	var te *textproto.Error
	if errors.As(err, &te) {
		pe.Code = te.Code
		switch {
		case te.Code >= 400 && te.Code < 500:
			return adapters.RetryableError(pe)
		case te.Code >= 500 && te.Code < 600:
			return adapters.PermanentError(pe)
		}
	}
	if p == PhaseFinalReply {
		return adapters.UnknownError(pe)
	}
	return adapters.RetryableError(pe)
}

// permanent is a local refusal that a retry cannot cure (configuration).
func permanent(p Phase, err error) error {
	return adapters.PermanentError(&PhaseError{Phase: p, Err: err})
}

// send runs one SMTP transaction and returns the final reply to the
// message ("250 2.0.0 Ok: queued as …").
//
// It uses net/smtp for everything up to RCPT and drives DATA itself over
// the client's textproto.Conn: net/smtp's Data writer hides both the final
// reply's text and whether a failure happened while writing the body
// (message not accepted) or while waiting for the reply (outcome unknown).
//
// stillOwner runs right before the end-of-data marker (see
// adapters.Request.StillOwner); on its error the marker is never sent.
//
// One connection, dialled here and closed on return, carries one
// transaction: no pool, and nothing in net/smtp or here sends a command or
// the message again (EHLO falling back to HELO is the only second command,
// and it is before MAIL). Sending the message again is only ever a new
// attempt, the runtime's decision on this attempt's classified error.
func (a *Adapter) send(ctx context.Context, env envelope, data []byte, stillOwner func(context.Context) error) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", a.cfg.Addr)
	if err != nil {
		return "", classify(ctx, PhaseDial, err)
	}
	defer conn.Close()
	// The context bounds the attempt: once it is done (Timeout or the
	// caller's cancel), any read or write fails at once. The TLS layer, if
	// any, sits on this conn and fails with it. No deadline is copied from
	// ctx onto the conn, so that an I/O timeout always finds ctx.Err() set
	// and classify can name the cause.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	c, err := smtp.NewClient(conn, a.host)
	if err != nil {
		return "", classify(ctx, PhaseGreeting, err)
	}
	defer c.Close()
	if err := c.Hello(a.cfg.LocalName); err != nil {
		return "", classify(ctx, PhaseHello, err)
	}

	if a.cfg.StartTLS != StartTLSNone {
		if ok, _ := c.Extension("STARTTLS"); ok {
			tc := &tls.Config{ServerName: a.host, InsecureSkipVerify: a.cfg.InsecureSkipVerify}
			if err := c.StartTLS(tc); err != nil {
				// No fallback to plain text: the session state is unknown
				// and "opportunistic" means "when offered", not "when it
				// works".
				return "", classify(ctx, PhaseStartTLS, err)
			}
		} else if a.cfg.StartTLS == StartTLSRequired {
			return "", permanent(PhaseStartTLS, errors.New("server does not offer STARTTLS and StartTLS is required"))
		}
	}

	if a.cfg.Username != "" {
		if ok, _ := c.Extension("AUTH"); !ok {
			return "", permanent(PhaseAuth, errors.New("server does not offer AUTH and credentials are configured"))
		}
		// net/smtp's PlainAuth refuses to send a password in clear text
		// to anything but loopback; say so as a configuration error rather
		// than let it look like a network failure.
		if _, isTLS := c.TLSConnectionState(); !isTLS && !isLoopback(a.host) {
			return "", permanent(PhaseAuth, errors.New("refusing to send credentials without TLS to a non-loopback server (set StartTLS)"))
		}
		if err := c.Auth(smtp.PlainAuth("", a.cfg.Username, a.cfg.Password, a.host)); err != nil {
			// The refusal's text is the server's, and it goes into the
			// intent's last_error and the logs: a server that echoes the
			// command it refuses ("501 5.5.4 Syntax: AUTH PLAIN AGFs…")
			// would put the password there, base64 being no cover.
			return "", classify(ctx, PhaseAuth, a.withoutCredentials(err))
		}
	}

	if err := c.Mail(env.From); err != nil {
		return "", classify(ctx, PhaseMail, err)
	}
	// Any refused recipient aborts the whole transaction: delivering to a
	// subset and retrying would send the others twice.
	for _, rcpt := range env.Recipients {
		if err := c.Rcpt(rcpt); err != nil {
			return "", classify(ctx, PhaseRcpt, err)
		}
	}

	text := c.Text
	if _, _, err := cmd(text, 354, "DATA"); err != nil {
		return "", classify(ctx, PhaseData, err)
	}
	w := text.DotWriter()
	if _, err := w.Write(data); err != nil {
		return "", classify(ctx, PhaseBody, err)
	}
	// The last moment the message can still be withdrawn: re-validate that
	// this attempt owns its idempotency key. If not (taken over after our
	// lock expired, or PostgreSQL cannot say), abort without the final dot:
	// the deferred closes drop the connection with the body unterminated,
	// and a server never accepts a message whose end-of-data marker it did
	// not get (RFC 5321 §3.8: a premature close aborts the transaction).
	// w.Close is not called: it would send the marker. Nothing happened:
	// retryable.
	if err := stillOwner(ctx); err != nil {
		return "", adapters.RetryableError(&PhaseError{Phase: PhaseBody, Err: fmt.Errorf("not sending the end of data: %w", err)})
	}
	// Close writes the end-of-data marker and flushes. If it fails, the
	// marker did not reach the network in full, so the server cannot have
	// taken the message: retryable. From the moment it succeeds the server
	// may accept the message, and only its reply can tell us.
	if err := w.Close(); err != nil {
		return "", classify(ctx, PhaseBody, err)
	}
	code, msg, err := text.ReadResponse(2)
	if err != nil {
		return "", classify(ctx, PhaseFinalReply, err)
	}
	reply := fmt.Sprintf("%d %s", code, msg)

	// The message is accepted; QUIT is a courtesy and its failure changes
	// nothing. Bound it so a slow server cannot stretch the attempt.
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	_ = c.Quit()
	return reply, nil
}

// withoutCredentials returns err, an AUTH failure, without the server's
// reply text: only its code and enhanced status code ("535 5.7.8"), so the
// failure is classified as before. A server may echo the AUTH command in
// its refusal: the password, or its base64, whole, cut short, decoded,
// glued to a word, or split over the reply's lines in pieces too short to
// tell from words; no rule that edits the text can find every form, so
// none of it is kept. A reply line that is no SMTP reply (textproto's
// ProtocolError quotes it whole) is dropped alike. Errors that are not a
// server's words (the connection, net/smtp's own refusals) carry no
// credentials and are returned as they are.
func (a *Adapter) withoutCredentials(err error) error {
	if a.cfg.Password == "" {
		return err
	}
	var te *textproto.Error
	if errors.As(err, &te) {
		msg := authTextDropped
		if m := enhancedCode.FindString(te.Msg); m != "" {
			msg = m + " " + msg
		}
		return &textproto.Error{Code: te.Code, Msg: msg}
	}
	var pe textproto.ProtocolError
	if errors.As(err, &pe) {
		return textproto.ProtocolError("a malformed reply to AUTH " + authTextDropped)
	}
	return err
}

// authTextDropped stands for an AUTH reply's text, which is not kept.
const authTextDropped = "(the server's text is not recorded: a reply to AUTH may echo the credentials)"

// enhancedCode is an enhanced status code (RFC 3463) at a reply's start.
var enhancedCode = regexp.MustCompile(`^[245]\.[0-9]{1,3}\.[0-9]{1,3}\b`)

// cmd sends one command and reads its reply, like net/smtp's unexported
// Client.cmd.
func cmd(text *textproto.Conn, expect int, format string, args ...any) (int, string, error) {
	id, err := text.Cmd(format, args...)
	if err != nil {
		return 0, "", err
	}
	text.StartResponse(id)
	defer text.EndResponse(id)
	return text.ReadResponse(expect)
}

// isLoopback matches net/smtp's own test for where PlainAuth may go
// without TLS.
func isLoopback(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}
