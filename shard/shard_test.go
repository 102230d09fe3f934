package shard_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
	"github.com/fencegate/fencegate/shard"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The assignment depends only on the set of shard names (not their order),
// spreads resources about evenly, and adding a shard moves only resources
// to the new one.
func TestAssignmentIsStable(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	mk := func(names ...string) *shard.Router {
		var ss []shard.Shard
		for _, n := range names {
			ss = append(ss, shard.Shard{Name: n, Pool: pool})
		}
		r, err := shard.New(ss, shard.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ab, ba, abc := mk("eu-1", "eu-2"), mk("eu-2", "eu-1"), mk("eu-1", "eu-2", "eu-3")
	counts := map[string]int{}
	moved := 0
	const n = 3000
	for i := range n {
		res := fmt.Sprintf("tenant-%d/report", i)
		s := ab.For(res).Name
		if ba.For(res).Name != s {
			t.Fatalf("%s: %s or %s depending on the order of the shards", res, s, ba.For(res).Name)
		}
		counts[s]++
		switch t3 := abc.For(res).Name; {
		case t3 == "eu-3":
			moved++
		case t3 != s:
			t.Fatalf("%s moved from %s to %s when eu-3 was added", res, s, t3)
		}
	}
	for name, c := range counts {
		if c < n*40/100 || c > n*60/100 {
			t.Errorf("shard %s has %d of %d resources", name, c, n)
		}
	}
	if moved < n*25/100 || moved > n*42/100 {
		t.Errorf("adding a third shard moved %d of %d resources, want about a third", moved, n)
	}
	// Bad input is a *fenceerr.InvalidError naming the argument or field.
	one := []shard.Shard{{Name: "a", Pool: pool}}
	newRouter := func(shards []shard.Shard, cfg shard.Config) func() error {
		return func() error { _, err := shard.New(shards, cfg); return err }
	}
	coretest.Refused(t, map[string]func() error{
		"shards":          newRouter(nil, shard.Config{}),
		"shards[0].Name":  newRouter([]shard.Shard{{Name: "", Pool: pool}}, shard.Config{}),
		"shards[1].Name":  newRouter([]shard.Shard{{Name: "a", Pool: pool}, {Name: "a", Pool: pool}}, shard.Config{}),
		"shards[1].Pool":  newRouter([]shard.Shard{{Name: "a", Pool: pool}, {Name: "b"}}, shard.Config{}),
		"Outbox.Schema":   newRouter(one, shard.Config{Schema: "fencegate", Outbox: outbox.Config{Schema: "other"}}),
		"Outbox.KeyScope": newRouter(one, shard.Config{Outbox: outbox.Config{KeyScope: "tenant"}}),
	})
}

// Two primaries (two databases, each its own epoch authority and
// namespace), one NATS, a gateway per primary: every resource's lease and
// intents live on its shard only, the fence holds per shard (a takeover
// there makes the old epoch stale), and each shard's effects are executed
// by its own gateway from its own outbox — none crosses over.
func TestTwoShardsOneNATS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nats := natstest.Start(t)
	names := []string{"eu-1", "eu-2"}
	roots := map[string]string{}
	var shards []shard.Shard
	for _, name := range names {
		pool := testdb.New(t)
		roots[name] = t.TempDir()
		f, err := file.New(file.Config{Root: roots[name]})
		if err != nil {
			t.Fatal(err)
		}
		g, err := gateway.Start(ctx, gateway.Config{Schema: testdb.Schema(), Pool: pool, NATSURL: nats.URL, RunDispatcher: true,
			Adapters: []adapters.Registration{f.Registration()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		shards = append(shards, shard.Shard{Name: name, Pool: pool})
	}
	r, err := shard.New(shards, shard.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}

	type placed struct {
		res   string
		shard *shard.Shard
		id    int64
	}
	var all []placed
	for i := range 12 {
		res := fmt.Sprintf("tenant-%d", i)
		s := r.For(res)
		l, err := s.Issuer.Acquire(ctx, res, "worker", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		out, err := s.Outbox.Enqueue(ctx, outbox.Intent{Resource: res, Epoch: l.Epoch, OperationID: "publish", Kind: file.Kind,
			Payload: fmt.Appendf(nil, `{"target":%q,"content":%q}`, res+".txt", s.Name)})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, placed{res, s, out.IntentID})
	}
	perShard := map[string]int{}
	for _, p := range all {
		perShard[p.shard.Name]++
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rec, err := p.shard.Outbox.Wait(wctx, p.id)
		cancel()
		if err != nil || rec.Status != outbox.StatusSucceeded || rec.Resource != p.res {
			t.Fatalf("%s on %s: %+v %v", p.res, p.shard.Name, rec, err)
		}
		for _, other := range r.Shards() {
			b, err := os.ReadFile(filepath.Join(roots[other.Name], p.res+".txt"))
			switch {
			case other == p.shard && (err != nil || string(b) != p.shard.Name):
				t.Fatalf("%s: %q, %v in its shard's root", p.res, b, err)
			case other != p.shard && err == nil:
				t.Fatalf("%s was published by %s's gateway too", p.res, other.Name)
			}
			if other == p.shard {
				continue
			}
			// The other primary knows nothing of the resource.
			var n int
			if err := other.Pool.QueryRow(ctx, testdb.SQL(`SELECT (SELECT count(*) FROM fencegate.intents WHERE resource_id = $1) + (SELECT count(*) FROM fencegate.resources WHERE resource_id = $1)`), p.res).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("%s left %d rows on %s, not its shard", p.res, n, other.Name)
			}
		}
	}
	if len(perShard) != 2 {
		t.Fatalf("12 resources all on one shard: %v", perShard)
	}

	// The fence, per shard: a takeover on the resource's primary makes the
	// first holder's epoch stale there.
	s := r.For("fenced")
	old, err := s.Issuer.Acquire(ctx, "fenced", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Issuer.Advance(ctx, "fenced", old.Epoch+1); err != nil {
		t.Fatal(err)
	}
	_, err = s.Outbox.Enqueue(ctx, outbox.Intent{Resource: "fenced", Epoch: old.Epoch, OperationID: "late", Kind: file.Kind,
		Payload: []byte(`{"target":"late.txt","content":"stale"}`)})
	if !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("the old holder's enqueue after a takeover on its shard: %v, want a stale epoch", err)
	}
}
