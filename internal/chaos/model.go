package chaos

import (
	"fmt"
	"math"
	"sort"

	"github.com/anishathalye/porcupine"
)

// register is the model's state of one resource: the current epoch, its
// holder, and whether a live lease may exist. Lease expiry is judged by
// PostgreSQL's clock, invisible to the history, so the model lets a lease
// expire at any moment (a takeover is always allowed) but never lets an
// epoch repeat, skip, or go back.
type register struct {
	epoch  int64
	holder string
	held   bool
}

// Linearizable checks the lease/epoch register history (acquire, renew,
// release and the fenced enqueue) against a per-resource sequential model
// with porcupine. It returns the operations of the resources whose history
// is not linearizable (empty when all are), and whether the check was
// conclusive within timeout.
func Linearizable(ops []Op, timeout float64) (bad map[string][]Op, conclusive bool) {
	byRes := map[string][]porcupine.Operation{}
	clients := map[string]int{}
	for _, o := range ops {
		if o.Kind == "enqueue" && (o.Reuse || o.Duplicate) {
			continue // a retry or refused reuse writes nothing: no register step
		}
		id, ok := clients[o.Worker]
		if !ok {
			id = len(clients)
			clients[o.Worker] = id
		}
		ret := o.Ret
		if o.Result == "unknown" {
			// The outcome was lost: it may take effect any time later.
			ret = math.MaxInt64
		}
		byRes[o.Resource] = append(byRes[o.Resource], porcupine.Operation{
			ClientId: id, Input: o, Call: o.Call, Output: o, Return: ret,
		})
	}
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{register{}} },
		Step: func(st, in, _ any) []any { return step(st.(register), in.(Op)) },
		DescribeOperation: func(in, _ any) string {
			return in.(Op).String()
		},
		DescribeState: func(st any) string { return fmt.Sprintf("%+v", st.(register)) },
	}
	model := nm.ToModel()
	bad = map[string][]Op{}
	conclusive = true
	res := make([]string, 0, len(byRes))
	for r := range byRes {
		res = append(res, r)
	}
	sort.Strings(res)
	for _, r := range res {
		out := porcupine.CheckOperationsTimeout(model, byRes[r], secs(timeout))
		switch out {
		case porcupine.Illegal:
			for _, p := range byRes[r] {
				bad[r] = append(bad[r], p.Input.(Op))
			}
		case porcupine.Unknown:
			conclusive = false
		}
	}
	return bad, conclusive
}

// step returns the states the register can be in after o, given s; none
// when o's outcome is impossible from s.
func step(s register, o Op) []any {
	granted := register{epoch: s.epoch + 1, holder: o.Holder, held: true}
	kept := s.held && s.holder == o.Holder
	switch o.Kind {
	case "acquire":
		switch o.Result {
		case "ok":
			var next []any
			if o.OutEpoch == s.epoch+1 {
				next = append(next, granted)
			}
			// A same-holder re-acquire of a live lease keeps the epoch.
			if kept && o.OutEpoch == s.epoch {
				next = append(next, s)
			}
			return next
		case "held":
			if s.held && s.holder != o.Holder && o.OutEpoch == s.epoch {
				return []any{s}
			}
			return nil
		case "unknown":
			next := []any{s, granted}
			return next
		default:
			return []any{s}
		}
	case "renew":
		switch o.Result {
		case "ok":
			if s.epoch == o.Epoch && s.holder == o.Holder && o.OutEpoch == o.Epoch {
				return []any{register{epoch: s.epoch, holder: s.holder, held: true}}
			}
			return nil
		default:
			return []any{s}
		}
	case "release":
		released := register{epoch: s.epoch, holder: s.holder}
		switch o.Result {
		case "ok":
			if s.epoch == o.Epoch && s.holder == o.Holder {
				return []any{released}
			}
			return nil
		case "unknown":
			if s.epoch == o.Epoch && s.holder == o.Holder {
				return []any{s, released}
			}
			return []any{s}
		default:
			return []any{s}
		}
	case "enqueue":
		switch o.Result {
		case "ok": // inserted: the supplied epoch was the current one
			if o.Epoch == s.epoch {
				return []any{s}
			}
			return nil
		case "stale":
			if o.Epoch != s.epoch {
				return []any{s}
			}
			return nil
		default:
			return []any{s}
		}
	}
	return []any{s}
}
