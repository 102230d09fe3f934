package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fencegate/fencegate/internal/fencemetrics"
	"github.com/fencegate/fencegate/internal/testkit/metricstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
)

// Every new epoch is recorded, with how it happened and who had authority
// before (a same-holder re-acquire too: it is a new epoch); a no-op advance
// is not.
// The issuer's metrics count the same grants.
func TestHistoryAndMetrics(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	reg := prometheus.NewPedanticRegistry()
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.WithRegisterer(reg))
	// A second issuer on the same registry shares the series.
	iss2 := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.WithRegisterer(reg))
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	a, err := iss.Acquire(ctx, "r", "A", time.Hour) // 1 free
	must(err)
	a2, err := iss.Acquire(ctx, "r", "A", time.Hour) // 2 reacquired: same holder, live, new epoch
	must(err)
	_, err = iss.Renew(ctx, "r", "A", a2.Epoch, time.Hour)
	must(err)
	expire(t, pool, "r")
	b, err := iss2.Acquire(ctx, "r", "B", time.Hour) // 3 after_expiry from A
	must(err)
	must(iss.Release(ctx, "r", "B", b.Epoch))
	_, err = iss.Acquire(ctx, "r", "C", time.Hour) // 4 released by B
	must(err)
	_, err = iss.Advance(ctx, "r", 10) // 10 external_advance over C
	must(err)
	_, err = iss.Advance(ctx, "r", 10) // equal: no-op, not recorded
	must(err)
	if _, err := iss.Advance(ctx, "r", 5); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("advance to lower = %v", err)
	}
	_, err = iss.Acquire(ctx, "r", "D", time.Hour) // 11 free (authority was outside)
	must(err)
	expire(t, pool, "r")
	_, err = iss.Acquire(ctx, "r", "D", time.Hour) // 12 after_expiry, D after itself
	must(err)
	if _, err := iss.Renew(ctx, "r", "A", a.Epoch, time.Hour); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("stale renew = %v", err)
	}

	got, err := iss.History(ctx, "r", 0)
	must(err)
	type row struct {
		epoch, prevEpoch int64
		holder, prev     string
		how              lease.How
		since            bool
	}
	want := []row{
		{12, 11, "D", "D", lease.HowAfterExpiry, true},
		{11, 10, "D", "", lease.HowFree, false},
		{10, 4, "", "C", lease.HowExternalAdvance, true},
		{4, 3, "C", "B", lease.HowReleased, true},
		{3, 2, "B", "A", lease.HowAfterExpiry, true},
		{2, 1, "A", "A", lease.HowReacquired, true},
		{1, 0, "A", "", lease.HowFree, false},
	}
	if len(got) != len(want) {
		t.Fatalf("history has %d grants, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Resource != "r" || g.Epoch != w.epoch || g.PreviousEpoch != w.prevEpoch || g.Holder != w.holder ||
			g.PreviousHolder != w.prev || g.How != w.how || (g.SincePreviousRenewal != nil) != w.since || g.GrantedAt.IsZero() {
			t.Errorf("grant %d = %+v; want %+v", i, g, w)
		}
		if g.SincePreviousRenewal != nil && (*g.SincePreviousRenewal < 0 || *g.SincePreviousRenewal > time.Minute) {
			t.Errorf("grant %d: since previous renewal %s", i, *g.SincePreviousRenewal)
		}
		if i > 0 && g.GrantedAt.After(got[i-1].GrantedAt) {
			t.Errorf("grant %d granted after the newer grant %d", i, i-1)
		}
	}

	// Limit, unknown resource, bad input.
	if two, err := iss.History(ctx, "r", 2); err != nil || len(two) != 2 || two[0].Epoch != 12 {
		t.Fatalf("History limit 2 = %+v, %v", two, err)
	}
	if none, err := iss.History(ctx, "nobody", 10); err != nil || none == nil || len(none) != 0 {
		t.Fatalf("History of unknown resource = %#v, %v; want empty, non-nil", none, err)
	}
	for _, lim := range []int{-1, lease.MaxHistoryLimit + 1} {
		if _, err := iss.History(ctx, "r", lim); !errors.Is(err, lease.ErrInvalid) {
			t.Fatalf("History limit %d = %v; want ErrInvalid", lim, err)
		}
	}

	// JSON round trip.
	b2, err := json.Marshal(got[0])
	must(err)
	var m map[string]any
	must(json.Unmarshal(b2, &m))
	if m["how"] != "after_expiry" || m["epoch"] != 12.0 || m["previous_holder"] != "D" || m["since_previous_renewal_seconds"] == nil {
		t.Fatalf("grant JSON = %s", b2)
	}
	var back lease.Grant
	must(json.Unmarshal(b2, &back))
	if back.Epoch != 12 || back.SincePreviousRenewal == nil || !back.GrantedAt.Equal(got[0].GrantedAt) {
		t.Fatalf("grant JSON round trip = %+v", back)
	}

	// Metrics.
	for how, n := range map[string]float64{"free": 2, "after_expiry": 2, "released": 1, "external_advance": 1, "reacquired": 1} {
		if v := gathered(t, reg, "fencegate_lease_takeovers_total", "how", how).GetCounter().GetValue(); v != n {
			t.Errorf("takeovers{how=%s} = %v, want %v", how, v, n)
		}
	}
	// Idempotent: the same vector the issuers count into.
	fencemetrics.StaleRejections(reg).WithLabelValues(fencemetrics.WhereEnqueue).Inc()
	for where, n := range map[string]float64{fencemetrics.WhereRenew: 1, fencemetrics.WhereEnqueue: 1, fencemetrics.WhereFileDestination: 0} {
		if v := gathered(t, reg, fencemetrics.StaleRejectionsName, "where", where).GetCounter().GetValue(); v != n {
			t.Errorf("stale rejections{where=%s} = %v, want %v", where, v, n)
		}
	}
	// One renewal, with about an hour left.
	h := gathered(t, reg, "fencegate_lease_renew_margin_seconds", "", "").GetHistogram()
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 3500 || h.GetSampleSum() > 3600 {
		t.Fatalf("renew margin: count %d sum %v; want 1 sample near 3600s", h.GetSampleCount(), h.GetSampleSum())
	}
}

// gathered returns the series of metric name whose label has value (any
// series when label is empty), failing the test when there is none.
func gathered(t *testing.T, reg prometheus.Gatherer, name, label, value string) *dto.Metric {
	t.Helper()
	labels := map[string]string{}
	if label != "" {
		labels[label] = value
	}
	return metricstest.Get(t, reg, name, labels)
}

// The history row is written in the grant's transaction: when it cannot be
// written, the grant does not happen either.
func TestHistoryInGrantTransaction(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()
	if _, err := iss.Acquire(ctx, "r", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	// A row squatting on epoch 2 makes recording the next grant fail.
	if _, err := pool.Exec(ctx, testdb.SQL(`INSERT INTO fencegate.epoch_grants (resource_id, epoch, holder, how, previous_epoch) VALUES ('r', 2, 'X', 'free', 1)`)); err != nil {
		t.Fatal(err)
	}
	expire(t, pool, "r")
	if _, err := iss.Acquire(ctx, "r", "B", time.Hour); err == nil {
		t.Fatal("acquire succeeded although its history row could not be written")
	}
	r, err := iss.Get(ctx, "r")
	if err != nil || r.Epoch != 1 || r.Holder != "A" {
		t.Fatalf("after the failed grant: %+v, %v; want epoch 1 still held (expired) by A", r, err)
	}
}
