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
