package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// outputFlag adds -o to a command that reads (ls, status, lease history):
// json or table; by default a table when stdout is a terminal, JSON
// otherwise, so that a script sees the JSON it always saw.
func outputFlag(fs *flag.FlagSet) *outputValue {
	o := &outputValue{}
	fs.Var(o, "o", "output: `json|table` (default: a table when stdout is a terminal, JSON otherwise)")
	return o
}

// outputValue is -o's value, and whether it was given: -o with an empty
// value is bad input, not the default.
type outputValue struct {
	v   string
	set bool
}

func (o *outputValue) String() string     { return o.v }
func (o *outputValue) Set(s string) error { o.v, o.set = s, true; return nil }

// tableOutput resolves -o: true for a table. Checked before connecting.
func (a *app) tableOutput(o *outputValue) (bool, error) {
	switch {
	case o.v == "table":
		return true, nil
	case o.v == "json":
		return false, nil
	case o.v == "" && !o.set:
		f, ok := a.stdout.(*os.File)
		return ok && isTerminal(f), nil
	}
	return false, badInput("output", fmt.Sprintf("-o must be json or table, got %q", o.v))
}

// newTable returns a writer of aligned columns on w; Flush writes them.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// cell is s on one line (newlines and runs of spaces as one space),
// shortened to max runes with an ellipsis; "-" when empty.
func cell(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if s == "" {
		return "-"
	}
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

// ago says how long before now t was, in its largest unit: "12s ago",
// "3m ago", "5h ago", "4d ago"; "in 3m" for a time ahead.
func ago(t, now time.Time) string {
	d := now.Sub(t)
	suffix, prefix := " ago", ""
	if d < 0 {
		d, suffix, prefix = -d, "", "in "
	}
	var s string
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		s = fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	return prefix + s + suffix
}

// when is t as a person reads it: local time to the second and how long
// ago; "-" for no time.
func when(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05 MST") + " (" + ago(*t, now) + ")"
}

// writeIntentsTable writes a page of `gateway ls` as a table: one intent a
// line, its error on that line shortened (gateway status ID has it whole).
func writeIntentsTable(w io.Writer, p operator.Page, now time.Time) {
	if len(p.Intents) == 0 {
		fmt.Fprintln(w, "no intents")
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATUS\tEFFECT\tKIND\tRESOURCE\tOPERATION\tATTEMPTS\tUPDATED\tLAST ERROR")
	for _, r := range p.Intents {
		lastErr := ""
		if r.LastError != nil {
			lastErr = *r.LastError
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.IntentID, r.Status, r.Effect, cell(r.Kind, 16),
			cell(r.Resource, 32), cell(r.OperationID, 32), r.Attempts, ago(r.UpdatedAt, now), cell(lastErr, 60))
	}
	_ = tw.Flush()
	if p.NextCursor != nil {
		fmt.Fprintf(w, "more: the same command with --cursor %s\n", *p.NextCursor)
	}
}

// writeIntentTable writes `gateway status`'s intent as a person reads it:
// one field a line, the error and the result whole.
func writeIntentTable(w io.Writer, r *outbox.Record, attempts []operator.Attempt, now time.Time) {
	tw := newTable(w)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("intent", fmt.Sprint(r.IntentID))
	row("resource", fmt.Sprintf("%s (epoch %d)", r.Resource, r.Epoch))
	row("operation", r.OperationID)
	row("kind", fmt.Sprintf("%s (fence %s)", r.Kind, r.Fence))
	row("key", r.IdempotencyKey)
	row("status", string(r.Status))
	row("effect", string(r.Effect))
	row("attempts", fmt.Sprint(r.Attempts))
	if r.LastError != nil {
		row("last error", cell(*r.LastError, 4096))
	}
	if r.NotBefore != nil {
		row("not before", when(r.NotBefore, now))
	}
	if len(r.Result) > 0 && string(r.Result) != "null" {
		row("result", cell(string(r.Result), 4096))
	}
	if r.Principal != "" {
		row("principal", r.Principal)
	}
	row("created", when(&r.CreatedAt, now))
	row("updated", when(&r.UpdatedAt, now))
	row("relayed", when(r.RelayedAt, now))
	row("completed", when(r.CompletedAt, now))
	_ = tw.Flush()
	if len(attempts) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "ATTEMPT\tSTARTED\tTOOK\tOUTCOME\tLOOKUP\tERROR")
	for _, a := range attempts {
		took, lookup, msg := "-", "-", "-"
		if a.DurationMS != nil {
			took = time.Duration(*a.DurationMS * float64(time.Millisecond)).Round(time.Millisecond).String()
		}
		if a.Lookup != nil {
			lookup = *a.Lookup
		}
		if a.Error != nil {
			msg = *a.Error
			// The class, unless the error already starts with it (the
			// runtime writes "permanent: …"): said once.
			if a.ErrorClass != nil && !strings.HasPrefix(msg, *a.ErrorClass+":") {
				msg = *a.ErrorClass + ": " + msg
			}
			msg = cell(msg, 200)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, when(a.StartedAt, now), took, a.Outcome, lookup, msg)
	}
	_ = tw.Flush()
}

// writeGrantsTable writes `gateway lease history` as a table, newest
// grant first.
func writeGrantsTable(w io.Writer, resource string, grants []lease.Grant, now time.Time) {
	if len(grants) == 0 {
		fmt.Fprintf(w, "no grants of %s\n", resource)
		return
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "EPOCH\tHOW\tHOLDER\tGRANTED\tPREVIOUS\tSINCE ITS RENEWAL\tPRINCIPAL")
	for _, g := range grants {
		prev := "-"
		if g.PreviousEpoch > 0 {
			prev = fmt.Sprint(g.PreviousEpoch)
			if g.PreviousHolder != "" {
				prev += " (" + g.PreviousHolder + ")"
			}
		}
		since := "-"
		if g.SincePreviousRenewal != nil {
			since = g.SincePreviousRenewal.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Epoch, g.How, cell(g.Holder, 32), when(&g.GrantedAt, now), cell(prev, 40), since, cell(g.Principal, 32))
	}
	_ = tw.Flush()
}
