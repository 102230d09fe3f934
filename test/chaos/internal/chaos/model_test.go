package chaos

import "testing"

// The register model accepts a legal history and rejects an epoch that
// repeats, a stale enqueue accepted after a takeover, and a renewal of a
// superseded lease.
func TestLinearizable(t *testing.T) {
	t.Parallel()
	good := []Op{
		{Worker: "a", Kind: "acquire", Resource: "r", Holder: "a", Call: 1, Ret: 2, Result: "ok", OutEpoch: 1},
		{Worker: "a", Kind: "enqueue", Resource: "r", Holder: "a", Epoch: 1, Call: 3, Ret: 4, Result: "ok"},
		{Worker: "b", Kind: "acquire", Resource: "r", Holder: "b", Call: 3, Ret: 5, Result: "held", OutEpoch: 1, OutHolder: "a"},
		{Worker: "b", Kind: "acquire", Resource: "r", Holder: "b", Call: 6, Ret: 7, Result: "ok", OutEpoch: 2},
		{Worker: "a", Kind: "enqueue", Resource: "r", Holder: "a", Epoch: 1, Call: 8, Ret: 9, Result: "stale"},
		{Worker: "a", Kind: "acquire", Resource: "r", Holder: "a", Call: 8, Ret: 0, Result: "unknown"},
	}
	if bad, ok := Linearizable(good, 10); len(bad) != 0 || !ok {
		t.Fatalf("legal history rejected: %v", bad)
	}
	cases := map[string]Op{
		"repeated epoch":   {Worker: "c", Kind: "acquire", Resource: "r", Holder: "c", Call: 10, Ret: 11, Result: "ok", OutEpoch: 2},
		"stale accepted":   {Worker: "a", Kind: "enqueue", Resource: "r", Holder: "a", Epoch: 1, Call: 10, Ret: 11, Result: "ok"},
		"superseded renew": {Worker: "a", Kind: "renew", Resource: "r", Holder: "a", Epoch: 1, Call: 10, Ret: 11, Result: "ok", OutEpoch: 1},
	}
	for name, o := range cases {
		h := append(append([]Op{}, good[:5]...), o)
		if bad, _ := Linearizable(h, 10); len(bad["r"]) == 0 {
			t.Errorf("%s: not detected", name)
		}
	}
}

// Every successful acquire returns an epoch higher than every epoch granted
// before for the resource: also to the holder that holds the lease, also
// when two workers share one holder id, and also after an acquire whose
// outcome was lost and which a later answer reveals.
func TestLinearizableNewEpochRule(t *testing.T) {
	t.Parallel()
	acq := func(w, holder string, call, ret int64, result string, epoch int64) Op {
		return Op{Worker: w, Kind: "acquire", Resource: "r", Holder: holder, Call: call, Ret: ret, Result: result, OutEpoch: epoch}
	}
	legal := map[string][]Op{
		"same holder, new epoch": {acq("a", "a", 1, 2, "ok", 1), acq("a", "a", 3, 4, "ok", 2)},
		"shared holder id": {
			acq("x", "h", 1, 2, "ok", 1), acq("y", "h", 3, 4, "ok", 2),
			{Worker: "x", Kind: "enqueue", Resource: "r", Holder: "h", Epoch: 1, Call: 5, Ret: 6, Result: "stale"},
			{Worker: "y", Kind: "enqueue", Resource: "r", Holder: "h", Epoch: 2, Call: 5, Ret: 6, Result: "ok"},
			{Worker: "x", Kind: "renew", Resource: "r", Holder: "h", Epoch: 1, Call: 7, Ret: 8, Result: "stale"},
			{Worker: "y", Kind: "release", Resource: "r", Holder: "h", Epoch: 2, Call: 9, Ret: 10, Result: "ok"},
		},
		"lost outcome revealed": {
			acq("a", "a", 1, 0, "unknown", 0), acq("b", "b", 2, 3, "ok", 1),
			{Worker: "c", Kind: "acquire", Resource: "r", Holder: "c", Call: 4, Ret: 5, Result: "held", OutEpoch: 2, OutHolder: "a"},
			acq("d", "d", 6, 7, "ok", 3),
		},
		"lost outcome, epoch skipped": {acq("a", "a", 1, 0, "unknown", 0), acq("b", "b", 2, 3, "ok", 2)},
	}
	for name, h := range legal {
		for i := range h {
			if h[i].Result == "unknown" {
				h[i].Ret = 1 << 40
			}
		}
		if bad, ok := Linearizable(h, 10); len(bad) != 0 || !ok {
			t.Errorf("%s: legal history rejected", name)
		}
	}
	illegal := map[string][]Op{
		"same holder keeps its epoch":       {acq("a", "a", 1, 2, "ok", 1), acq("a", "a", 3, 4, "ok", 1)},
		"shared holder id, one epoch twice": {acq("x", "h", 1, 2, "ok", 1), acq("y", "h", 3, 4, "ok", 1)},
		"granted again after a crash":       {acq("a", "a", 1, 2, "ok", 5), acq("b", "b", 3, 4, "ok", 5)},
		"epoch goes back":                   {acq("a", "a", 1, 2, "ok", 5), acq("b", "b", 3, 4, "ok", 4)},
		"revealed epoch granted again": {
			acq("a", "a", 1, 1<<40, "unknown", 0), acq("b", "b", 2, 3, "ok", 1),
			{Worker: "c", Kind: "acquire", Resource: "r", Holder: "c", Call: 4, Ret: 5, Result: "held", OutEpoch: 2, OutHolder: "a"},
			acq("d", "d", 6, 7, "ok", 2),
		},
		"shared holder, stale epoch accepted": {
			acq("x", "h", 1, 2, "ok", 1), acq("y", "h", 3, 4, "ok", 2),
			{Worker: "x", Kind: "enqueue", Resource: "r", Holder: "h", Epoch: 1, Call: 5, Ret: 6, Result: "ok"},
		},
		"held by itself": {
			acq("x", "h", 1, 2, "ok", 1),
			{Worker: "y", Kind: "acquire", Resource: "r", Holder: "h", Call: 3, Ret: 4, Result: "held", OutEpoch: 1, OutHolder: "h"},
		},
	}
	for name, h := range illegal {
		if bad, _ := Linearizable(h, 10); len(bad["r"]) == 0 {
			t.Errorf("%s: not detected", name)
		}
	}
}
