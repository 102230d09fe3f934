package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
)

// Violation is one broken invariant.
type Violation struct {
	// Invariant names the rule: I1–I9, L, U, E, V or R (docs/guarantees.md, "Guarantees and how
	// we test them").
	Invariant string
	// Message says what is wrong.
	Message string
	// Evidence is the offending part of the history and the state.
	Evidence string
}

// String returns "Invariant: Message".
func (v Violation) String() string { return v.Invariant + ": " + v.Message }

// Report is the checker's verdict.
type Report struct {
	Violations []Violation
	// Stats counts what was checked.
	Stats map[string]int
	// Deliveries counts, per destination kind, the business keys by the
	// final statuses of their intents and the effects at the destination:
	// "email" -> "succeeded: 1" -> keys.
	Deliveries map[string]map[string]int
}

// Count returns how many violations of invariant the report holds.
func (r *Report) Count(invariant string) int {
	n := 0
	for _, v := range r.Violations {
		if v.Invariant == invariant {
			n++
		}
	}
	return n
}

func (r *Report) add(inv, msg string, evidence ...string) {
	r.Violations = append(r.Violations, Violation{Invariant: inv, Message: msg, Evidence: strings.Join(evidence, "\n")})
}

// Check reads what the run left behind (Observe) and verifies the history
// against it (Verify). Call it after the run has drained.
func Check(ctx context.Context, env Env, ops []Op) (*Report, error) {
	obs, err := Observe(ctx, env, ops)
	if err != nil {
		return nil, err
	}
	return Verify(obs, ops), nil
}

// Verify checks the invariants I1–I9 and the register's linearizability
// (L) of the history ops against the observed state:
//
//	I1 every intent committed with its resource's current epoch
//	I2 a file target's published epoch never decreases; its content is
//	   the current publication's
//	I3 at most one effect per business key where the mode promises one
//	   (messages per Message-ID, publications per key)
//	I4 every intent terminal after the drain; acknowledged at the epoch
//	   stored
//	I5 no effect without a committed intent
//	I6 a reused operation id with different content never stored
//	I7 a recorded status never contradicts the effect: superseded,
//	   cancelled or failed while the effect is at the destination, or
//	   succeeded while it is not
//	I8 nothing acknowledged is lost: every acknowledged grant and enqueue
//	   is in the database (also after PostgreSQL crashes)
//	I9 an epoch is granted at most once per resource
//	L  the lease/epoch register history is linearizable (porcupine)
//	U  an unknown intent says why (last_error)
//	E  no worker operation failed for a reason the run did not expect (an
//	   SQL error, an invalid input): such a run checks nothing
//	V  the run exercised what it checks (Observed.Min, every scheduled
//	   fault injected)
func Verify(obs *Observed, ops []Op) *Report {
	r := &Report{Stats: map[string]int{}, Deliveries: map[string]map[string]int{}}
	byOp := map[string]Intent{}
	for _, in := range obs.Intents {
		byOp[in.Resource+"\x00"+in.OpID] = in
	}
	r.Stats["intents"] = len(obs.Intents)
	r.Stats["operations"] = len(ops)
	for _, o := range ops {
		r.Stats[o.Kind+"/"+o.Result]++
	}
	for _, n := range obs.LateStores {
		r.Stats["late_stores"] += n
	}

	checkCommitOrder(obs, r)
	checkAcknowledged(obs, ops, byOp, r)
	checkGrants(obs, ops, r)

	// I4: every committed intent is terminal.
	for _, in := range obs.Intents {
		if in.Status == "pending" || in.Status == "relayed" {
			r.add("I4", fmt.Sprintf("intent %d (%s/%s) is still %s after the drain", in.ID, in.Resource, in.OpID, in.Status))
		}
		r.Stats["status/"+in.Status]++
	}

	// I6: an operation id reused with different content is never stored
	// and never executed.
	for _, o := range ops {
		if o.Kind != "enqueue" || !o.Reuse {
			continue
		}
		r.Stats["reuse_attempts"]++
		if o.Result == "ok" {
			r.add("I6", fmt.Sprintf("reuse of operation id %s/%s with different content was accepted", o.Resource, o.OpID), o.String())
		}
		if in, ok := byOp[o.Resource+"\x00"+o.OpID]; ok && jsonEq(in.Payload, o.Payload) {
			r.add("I6", fmt.Sprintf("intent %d stores the refused content of a reused operation id", in.ID), o.String())
		}
	}
	for _, in := range obs.Intents {
		if strings.Contains(in.Payload, "CONFLICT") {
			r.add("I6", fmt.Sprintf("intent %d carries refused content", in.ID))
		}
	}

	// E: every operation's error was one the run expects. One violation
	// per kind of operation and error text, with the first such operation.
	unexpected := map[string][]Op{}
	for _, o := range ops {
		if o.Result == "error" {
			unexpected[o.Kind+"\x00"+o.Err] = append(unexpected[o.Kind+"\x00"+o.Err], o)
		}
	}
	for _, k := range sortedKeys(unexpected) {
		same := unexpected[k]
		o := same[0]
		r.add("E", fmt.Sprintf("%d %s operations failed unexpectedly (first: worker %s on %s): %s", len(same), o.Kind, o.Worker, o.Resource, o.Err), o.String())
	}

	checkDeliveries(obs, r, "email", obs.MailCopies, obs.MailByIntent, !obs.EmailOnce)
	hookKeys, hookIntents := map[string]int{}, map[int64]int{}
	for _, d := range obs.Hooks {
		if !d.Refused {
			hookKeys[d.Key]++
			hookIntents[d.IntentID]++
		}
	}
	checkDeliveries(obs, r, "webhook", hookKeys, hookIntents, obs.HookDedups)
	checkFiles(obs, r)
	checkExercised(obs, ops, r)

	// L: the lease/epoch register's history is linearizable.
	bad, conclusive := Linearizable(ops, 60)
	if !conclusive {
		r.Stats["linearizability_inconclusive"] = 1
	}
	for _, res := range sortedKeys(bad) {
		hist := bad[res]
		why, lines := explainL(hist)
		if lines == nil {
			for _, o := range hist {
				lines = append(lines, o.String())
			}
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
		}
		r.add("L", fmt.Sprintf("the lease/epoch history of %s is not linearizable%s", res, why), lines...)
	}
	return r
}

// explainL looks for the first plain real-time contradiction in a
// resource's history that porcupine rejected: an operation that began after
// a grant of epoch e had been acknowledged and still saw an epoch at or
// below e as current (an acquire returning it, an enqueue or renewal
// accepted with an older one). It returns the reason and the two
// operations, or nil when the contradiction is subtler (the caller then
// shows the history's tail).
func explainL(hist []Op) (string, []string) {
	var best Op // the acknowledged grant with the highest epoch so far
	grants := make([]Op, 0, len(hist))
	for _, o := range hist {
		if o.Kind == "acquire" && o.Result == "ok" {
			grants = append(grants, o)
		}
	}
	sort.SliceStable(grants, func(i, j int) bool { return grants[i].Ret < grants[j].Ret })
	for _, o := range hist { // by invocation time (ReadHistory's order)
		best = Op{}
		for _, g := range grants {
			if g.Ret >= o.Call {
				break
			}
			if g.OutEpoch > best.OutEpoch {
				best = g
			}
		}
		if best.Kind == "" {
			continue
		}
		var why string
		switch {
		case o.Kind == "acquire" && o.Result == "ok" && o.OutEpoch <= best.OutEpoch:
			why = fmt.Sprintf(": an acquire by %q returned epoch %d after epoch %d had been granted to %q", o.Holder, o.OutEpoch, best.OutEpoch, best.Holder)
		case o.Kind == "enqueue" && o.Result == "ok" && !o.Duplicate && o.Epoch < best.OutEpoch:
			why = fmt.Sprintf(": an enqueue with epoch %d was accepted after epoch %d had been granted", o.Epoch, best.OutEpoch)
		case o.Kind == "renew" && o.Result == "ok" && o.Epoch < best.OutEpoch:
			why = fmt.Sprintf(": a renewal of epoch %d succeeded after epoch %d had been granted", o.Epoch, best.OutEpoch)
		default:
			continue
		}
		return why, []string{best.String(), o.String()}
	}
	return "", nil
}

// crashAfter describes the PostgreSQL crash that can explain losing what
// was acknowledged at mono time t: the first kill -9 after t, or one just
// before it (the postmaster dies first; its backends a moment later, and
// may still commit and answer meanwhile).
func crashAfter(obs *Observed, t int64) string {
	for _, c := range obs.Crashes {
		switch {
		case c >= t:
			return fmt.Sprintf("; PostgreSQL was killed (-9) %s after the acknowledgement", time.Duration(c-t).Round(time.Millisecond))
		case t-c < int64(time.Second):
			return fmt.Sprintf("; PostgreSQL was being killed (-9) %s before the acknowledgement", time.Duration(t-c).Round(time.Millisecond))
		}
	}
	return ""
}

// checkAcknowledged verifies I8 and I4 for enqueues: every acknowledged
// enqueue is in the outbox, as acknowledged; and I8 for grants: every
// acknowledged grant is in the grant log with its holder, and no resource
// ended below an acknowledged epoch.
func checkAcknowledged(obs *Observed, ops []Op, byOp map[string]Intent, r *Report) {
	for _, o := range ops {
		if o.Kind != "enqueue" || o.Result != "ok" {
			continue
		}
		in, ok := byOp[o.Resource+"\x00"+o.OpID]
		switch {
		case !ok:
			r.add("I8", fmt.Sprintf("acknowledged enqueue %s/%s (intent %d) is not in the outbox%s", o.Resource, o.OpID, o.IntentID, crashAfter(obs, o.Ret)), o.String())
		case in.ID != o.IntentID:
			r.add("I8", fmt.Sprintf("acknowledged enqueue %s/%s was intent %d; the outbox has intent %d for it%s", o.Resource, o.OpID, o.IntentID, in.ID, crashAfter(obs, o.Ret)), o.String())
		case !o.Duplicate && in.Epoch != o.Epoch:
			r.add("I4", fmt.Sprintf("enqueue %s/%s acknowledged at epoch %d, stored at %d", o.Resource, o.OpID, o.Epoch, in.Epoch), o.String())
		}
	}
	logged := map[string][]string{} // resource/epoch -> holders
	for _, g := range obs.Grants {
		k := fmt.Sprintf("%s/%d", g.Resource, g.Epoch)
		logged[k] = append(logged[k], g.Holder)
	}
	for _, o := range ops {
		if o.Kind != "acquire" || o.Result != "ok" {
			continue
		}
		r.Stats["acknowledged_grants"]++
		holders := logged[fmt.Sprintf("%s/%d", o.Resource, o.OutEpoch)]
		found := false
		for _, h := range holders {
			found = found || h == o.Holder
		}
		if !found {
			what := "the database has no grant of that epoch"
			if len(holders) > 0 {
				what = fmt.Sprintf("the database granted that epoch to %q", strings.Join(holders, `", "`))
			}
			r.add("I8", fmt.Sprintf("acknowledged grant of epoch %d on %s to %q is lost: %s%s", o.OutEpoch, o.Resource, o.Holder, what, crashAfter(obs, o.Ret)), o.String())
		}
		if cur, ok := obs.Epochs[o.Resource]; !ok || cur < o.OutEpoch {
			r.add("I8", fmt.Sprintf("%s ended at epoch %d, below the acknowledged epoch %d%s", o.Resource, cur, o.OutEpoch, crashAfter(obs, o.Ret)), o.String())
		}
	}
}

// checkGrants verifies I9: no two acknowledged acquires got the same epoch
// of one resource, and the database changed a resource to one epoch once.
func checkGrants(obs *Observed, ops []Op, r *Report) {
	acks := map[string][]Op{}
	for _, o := range ops {
		if o.Kind == "acquire" && o.Result == "ok" {
			k := fmt.Sprintf("%s epoch %d", o.Resource, o.OutEpoch)
			acks[k] = append(acks[k], o)
		}
	}
	for _, k := range sortedKeys(acks) {
		if as := acks[k]; len(as) > 1 {
			lines := make([]string, 0, len(as))
			holders := make([]string, 0, len(as))
			for _, o := range as {
				lines = append(lines, o.String())
				holders = append(holders, fmt.Sprintf("%s (worker %s)", o.Holder, o.Worker))
			}
			r.add("I9", fmt.Sprintf("%s was granted %d times: to %s", k, len(as), strings.Join(holders, ", ")), lines...)
		}
	}
	logged := map[string]int{}
	for _, g := range obs.Grants {
		logged[fmt.Sprintf("%s epoch %d", g.Resource, g.Epoch)]++
	}
	for _, k := range sortedKeys(logged) {
		if n := logged[k]; n > 1 {
			r.add("I9", fmt.Sprintf("the database changed %s to %s %d times", strings.SplitN(k, " ", 2)[0], strings.SplitN(k, " ", 2)[1], n))
		}
	}
}

// checkCommitOrder verifies I1: ordered by commit timestamp, every intent
// carries the highest epoch granted on its resource before it committed.
func checkCommitOrder(obs *Observed, r *Report) {
	type ev struct {
		res   string
		epoch int64
		ts    time.Time
		grant bool
		what  string
	}
	evs := make([]ev, 0, len(obs.Grants)+len(obs.Intents))
	for _, g := range obs.Grants {
		evs = append(evs, ev{res: g.Resource, epoch: g.Epoch, ts: g.Committed, grant: true, what: "grant to " + g.Holder})
	}
	for _, in := range obs.Intents {
		evs = append(evs, ev{res: in.Resource, epoch: in.Epoch, ts: in.Committed, what: fmt.Sprintf("intent %d op %s", in.ID, in.OpID)})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].ts.Before(evs[j].ts) })
	current := map[string]int64{}
	for i, e := range evs {
		if e.grant {
			if e.epoch < current[e.res] {
				r.add("I1", fmt.Sprintf("epoch of %s went back from %d to %d", e.res, current[e.res], e.epoch))
			}
			current[e.res] = max(current[e.res], e.epoch)
			r.Stats["grants"]++
			continue
		}
		tie := (i > 0 && evs[i-1].ts.Equal(e.ts)) || (i+1 < len(evs) && evs[i+1].ts.Equal(e.ts))
		if !tie && e.epoch != current[e.res] {
			var ctxLines []string
			for j := max(0, i-5); j < min(len(evs), i+3); j++ {
				ctxLines = append(ctxLines, fmt.Sprintf("%s %s epoch %d %s", evs[j].ts.Format(time.RFC3339Nano), evs[j].res, evs[j].epoch, evs[j].what))
			}
			r.add("I1", fmt.Sprintf("%s on %s committed with epoch %d while the current epoch was %d", e.what, e.res, e.epoch, current[e.res]), ctxLines...)
		}
	}
}

// deniesEffect reports whether status says the effect did not happen.
func deniesEffect(status string) bool {
	return status == "superseded" || status == "cancelled" || status == "failed"
}

// checkDeliveries verifies I3, I5, I7 and U for the intents of kind from
// the effects at their destination: perKey counts the effects per
// business key (email: messages with the key's Message-ID; webhook:
// requests acted on with its Idempotency-Key), perIntent those each
// intent's own attempts caused. Where the destination does not dedup
// (dedups false), a key has at most one effect, and exactly one when an
// intent of it succeeded; an intent failed, cancelled or superseded caused
// none; an unknown intent says why. The keys are tallied in
// r.Deliveries[kind] by their intents' statuses and their effects.
func checkDeliveries(obs *Observed, r *Report, kind string, perKey map[string]int, perIntent map[int64]int, dedups bool) {
	byKey := map[string][]Intent{}
	for _, in := range obs.Intents {
		if in.Kind == kind {
			byKey[in.Key] = append(byKey[in.Key], in)
		}
	}
	keys := map[string]bool{}
	for k := range perKey {
		keys[k] = true
	}
	for k := range byKey {
		keys[k] = true
	}
	tally := map[string]int{}
	r.Deliveries[kind] = tally
	for _, k := range sortedKeys(keys) {
		n, ins := perKey[k], byKey[k]
		r.Stats[kind+"_effects"] += n
		r.Stats[kind+"_keys"]++
		evidence := describeIntents(ins)
		if late := obs.LateStores[email.MessageID(k, obs.MailDomain)]; kind == "email" && late > 0 {
			evidence += fmt.Sprintf("the destination stored %d of its messages after the sender's reply deadline\n", late)
		}
		if kind == "webhook" {
			evidence += describeHooks(obs.Hooks, k)
		}
		statuses := map[string]bool{}
		succeeded := false
		for _, in := range ins {
			statuses[in.Status] = true
			succeeded = succeeded || in.Status == "succeeded"
		}
		tally[fmt.Sprintf("%s: %s", strings.Join(sortedKeys(statuses), "+"), effects(n))]++
		if n > 1 && !dedups {
			r.add("I3", fmt.Sprintf("%s: %d effects of business key %q at a destination that does not dedup, want at most 1", kind, n, k), evidence)
		}
		if n > 0 && len(ins) == 0 {
			r.add("I5", fmt.Sprintf("%s: an effect of business key %q, but no committed intent has that key", kind, k))
		}
		if succeeded && n == 0 {
			r.add("I7", fmt.Sprintf("%s: business key %q succeeded, but the destination holds no effect of it", kind, k), evidence)
		}
		for _, in := range ins {
			switch {
			case deniesEffect(in.Status) && perIntent[in.ID] > 0:
				r.add("I7", fmt.Sprintf("%s: intent %d (key %q) is %s, but the destination acted on %d of its attempts", kind, in.ID, k, in.Status, perIntent[in.ID]), evidence)
			case in.Status == "unknown" && strings.TrimSpace(in.LastError) == "":
				r.add("U", fmt.Sprintf("%s: intent %d (key %q) is unknown without a last_error: the operator cannot see why", kind, in.ID, k), evidence)
			}
		}
	}
}

func effects(n int) string {
	switch n {
	case 0:
		return "no effect"
	case 1:
		return "1 effect"
	}
	return fmt.Sprintf("%d effects", n)
}

func describeHooks(ds []Delivery, key string) string {
	var b strings.Builder
	for _, d := range ds {
		what := "acted on"
		if d.Refused {
			what = "refused"
		}
		if d.Key == key {
			fmt.Fprintf(&b, "%s request of intent %d epoch %d at %s reused_conn=%v fault=%q\n", what, d.IntentID, d.Epoch, d.At.Format("15:04:05.000"), d.Reused, d.Fault)
		}
	}
	return b.String()
}

// checkExercised verifies V: the run did what its checks need — enough
// acknowledged enqueues and intents, effects at every destination kind,
// and every fault kind the nemesis scheduled injected at least once.
func checkExercised(obs *Observed, ops []Op, r *Report) {
	acked := 0
	for _, o := range ops {
		if o.Kind == "enqueue" && o.Result == "ok" && !o.Duplicate {
			acked++
		}
	}
	r.Stats["acknowledged_enqueues"] = acked
	want := obs.Min
	if acked < want.Enqueues {
		r.add("V", fmt.Sprintf("only %d acknowledged enqueues, want at least %d", acked, want.Enqueues))
	}
	if len(obs.Intents) < want.Enqueues {
		r.add("V", fmt.Sprintf("only %d intents checked, want at least %d", len(obs.Intents), want.Enqueues))
	}
	for _, k := range []string{"email_effects", "webhook_effects", "file_publications"} {
		if r.Stats[k] < want.Effects {
			r.add("V", fmt.Sprintf("only %d %s, want at least %d", r.Stats[k], strings.ReplaceAll(k, "_", " "), want.Effects))
		}
	}
	for _, k := range sortedKeys(obs.Faults) {
		if obs.Faults[k] > 0 && obs.Injected[k] == 0 {
			r.add("V", fmt.Sprintf("fault %s was scheduled %d times and never injected", k, obs.Faults[k]))
		}
	}
}

// checkFiles verifies I2, I3, I5, I6 and I7 from each target's manifest.
func checkFiles(obs *Observed, r *Report) {
	byID := map[int64]Intent{}
	targets := map[string][]Intent{}
	for _, in := range obs.Intents {
		byID[in.ID] = in
		if in.Kind == "file" {
			targets[fileTarget(in)] = append(targets[fileTarget(in)], in)
		}
	}
	for _, target := range sortedKeys(targets) {
		ins := targets[target]
		t := obs.Files[target]
		var maxSucceeded int64
		for _, in := range ins {
			if in.Status == "succeeded" {
				maxSucceeded = max(maxSucceeded, in.Epoch)
			}
		}
		var pubs []file.Publication
		if t.Exists {
			pubs = applied(t.Manifest)
		}
		r.Stats["file_publications"] += len(pubs)
		published := map[string]int{}
		var prev int64
		for i, p := range pubs {
			if p.Epoch < prev {
				r.add("I2", fmt.Sprintf("%s: publication %d (intent %d) has epoch %d after epoch %d", target, i, p.IntentID, p.Epoch, prev), describeIntents(ins))
			}
			prev = max(prev, p.Epoch)
			published[p.IdempotencyKey]++
			in, ok := byID[p.IntentID]
			if !ok || in.Key != p.IdempotencyKey || in.Epoch != p.Epoch {
				r.add("I5", fmt.Sprintf("%s: publication of intent %d (key %s, epoch %d) has no matching committed intent", target, p.IntentID, p.IdempotencyKey, p.Epoch))
			}
		}
		for _, k := range sortedKeys(published) {
			if n := published[k]; n > 1 {
				r.add("I3", fmt.Sprintf("%s: business key %s published %d times", target, k, n), describeIntents(ins))
			}
		}
		// With a full history, publications older than its oldest entry
		// may have dropped out: their absence proves nothing.
		var oldest int64
		if t.Truncated && len(pubs) > 0 {
			oldest = pubs[0].Epoch
		}
		for _, in := range ins {
			n := published[in.Key]
			switch {
			case n > 0 && deniesEffect(in.Status):
				r.add("I7", fmt.Sprintf("intent %d (%s, key %s) is %s, but %s holds its publication", in.ID, in.OpID, in.Key, in.Status, target), describeIntents([]Intent{in}))
			case n == 0 && in.Status == "succeeded" && in.Epoch > oldest:
				r.add("I7", fmt.Sprintf("intent %d (%s, key %s) succeeded, but %s has no publication of its key", in.ID, in.OpID, in.Key, target), describeIntents([]Intent{in}))
			}
		}
		if !t.Exists {
			if maxSucceeded > 0 {
				r.add("I2", fmt.Sprintf("%s has succeeded publications but no manifest", target))
			}
			continue
		}
		var current file.Publication // the last applied, whose content the file holds
		if len(pubs) > 0 {
			current = pubs[len(pubs)-1]
		}
		if !t.ContentMatches {
			r.add("I2", fmt.Sprintf("%s: content is not the current publication's (intent %d)", target, current.IntentID))
		}
		if current.Epoch != prev || (maxSucceeded > 0 && current.Epoch < maxSucceeded) {
			r.add("I2", fmt.Sprintf("%s: final content from epoch %d, but epoch %d published (succeeded up to %d)", target, current.Epoch, prev, maxSucceeded))
		}
		if t.Refused {
			r.add("I6", fmt.Sprintf("%s holds refused content", target))
		}
	}
}

// applied returns the publications of m that happened, oldest first: its
// history, and its current publication unless that is still pending. A
// pending current publication was written ahead of a rename that never
// came (the attempt's owner check failed, or it crashed before the rename;
// file.Adapter.Published reports one whose content is in place as
// published): its intent had no effect there, and the file holds the last
// applied publication's content.
func applied(m file.Manifest) []file.Publication {
	out := append([]file.Publication(nil), m.History...)
	if m.State != file.StatePending {
		out = append(out, m.Publication)
	}
	return out
}

func describeIntents(ins []Intent) string {
	var b strings.Builder
	for _, in := range ins {
		fmt.Fprintf(&b, "intent %d %s/%s epoch %d key %s status %s result %s\n", in.ID, in.Resource, in.OpID, in.Epoch, in.Key, in.Status, in.Result)
	}
	return b.String()
}

func jsonEq(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return a == b
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
