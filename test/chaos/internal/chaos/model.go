package chaos

import (
	"fmt"
	"math"
	"sort"

	"github.com/anishathalye/porcupine"
)

// register is the model's state of one resource: the current epoch, its
// holder, whether a live lease may exist, and whether it was released.
// Lease expiry is judged by PostgreSQL's clock, invisible to the history,
// so the model lets a lease expire at any moment (a takeover is always
// allowed). The rule it enforces on grants is the public one: every
// successful acquire returns an epoch higher than every epoch granted
// before for that resource — also to the holder that already holds the
// lease, and also when two workers share one holder id (the holder is
// the lease's identity, the worker only the porcupine client).
//
// unknown marks a state after an acquire whose outcome was lost and which
// took effect: the current epoch is then some value above epoch (the
// issuer picked it; nobody saw it) until an operation reveals it.
type register struct {
	epoch    int64
	unknown  bool
	holder   string
	held     bool
	released bool
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
	// is reports whether epoch e can be the current epoch in s.
	is := func(e int64) bool {
		if s.unknown {
			return e > s.epoch
		}
		return e == s.epoch
	}
	known := func(e int64) register { r := s; r.epoch, r.unknown = e, false; return r }
	switch o.Kind {
	case "acquire":
		switch o.Result {
		case "ok":
			// Higher than every epoch granted before: above the current
			// one, which in an unknown state is itself above s.epoch.
			floor := s.epoch
			if s.unknown {
				floor++
			}
			if o.OutEpoch > floor {
				return []any{register{epoch: o.OutEpoch, holder: o.Holder, held: true}}
			}
			return nil
		case "held":
			// Only another holder's live lease refuses an acquire: the same
			// holder gets a new epoch.
			if s.held && s.holder != o.Holder && s.holder == o.OutHolder && is(o.OutEpoch) {
				return []any{known(o.OutEpoch)}
			}
			return nil
		case "unknown":
			return []any{s, register{epoch: s.epoch, unknown: true, holder: o.Holder, held: true}}
		default:
			return []any{s}
		}
	case "renew":
		ok := s.holder == o.Holder && !s.released && is(o.Epoch)
		switch o.Result {
		case "ok":
			if ok && o.OutEpoch == o.Epoch {
				r := known(o.Epoch)
				r.held = true
				return []any{r}
			}
			return nil
		case "unknown":
			if ok {
				r := known(o.Epoch)
				r.held = true
				return []any{s, r}
			}
			return []any{s}
		default:
			return []any{s}
		}
	case "release":
		// Releasing the current epoch's lease succeeds for its holder, and
		// again once it is released.
		ok := is(o.Epoch) && (s.holder == o.Holder || (s.released && !s.unknown))
		released := known(o.Epoch)
		released.held, released.released = false, true
		switch o.Result {
		case "ok":
			if ok {
				return []any{released}
			}
			return nil
		case "unknown":
			if ok {
				return []any{s, released}
			}
			return []any{s}
		default:
			return []any{s}
		}
	case "enqueue":
		switch o.Result {
		case "ok": // inserted: the supplied epoch was the current one
			if is(o.Epoch) {
				return []any{known(o.Epoch)}
			}
			return nil
		case "stale":
			if s.unknown || o.Epoch != s.epoch {
				return []any{s}
			}
			return nil
		default:
			return []any{s}
		}
	}
	return []any{s}
}
