package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/lease"
)

// The pause detector samples continuously into
// fencegate_worker_pause_seconds; two Keepers share one registry.
func TestKeeperPauseMetrics(t *testing.T) {
	t.Parallel()
	iss, _ := setup(t)
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	cfg := lease.KeeperConfig{TTL: 10 * time.Second, PauseTick: 2 * time.Millisecond, Registerer: reg}
	k1, err := iss.Hold(ctx, "p1", "A", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer k1.Stop()
	k2, err := iss.Hold(ctx, "p2", "A", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h := gathered(t, reg, "fencegate_worker_pause_seconds", "", "").GetHistogram()
		s1, s2 := k1.Pauses().Samples, k2.Pauses().Samples
		if s1 >= 10 && s2 >= 10 && h.GetSampleCount() >= uint64(s1+s2)-2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pause samples: keepers %d, %d; histogram %d", s1, s2, h.GetSampleCount())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if p := k1.Pauses(); p.Max < 0 || p.Max < p.Last {
		t.Fatalf("pause stats = %+v", p)
	}
	k1.Stop()
	select {
	case <-k1.Stopped():
	default:
		t.Fatal("Stopped not closed after Stop")
	}
	if !errors.Is(k1.Err(), context.Canceled) || errors.Is(k1.Err(), lease.ErrLeaseLost) {
		t.Fatalf("cause after Stop = %v; want Canceled, not lost", k1.Err())
	}

	// Bad configuration is refused before anything is acquired.
	if _, err := iss.Hold(ctx, "p3", "A", lease.KeeperConfig{TTL: time.Second, PauseLogFraction: -1}); !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("negative PauseLogFraction = %v; want ErrInvalid", err)
	}
}
