package gateway

import (
	"cmp"
	"context"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/outbox"
)

// clients makes the idempotency store and the outbox client the adapters
// and the admin server share.
func (s *Gateway) clients(cfg Config, log *slog.Logger, reg *prometheus.Registry) error {
	icfg := cfg.Idempotency
	icfg.Logger = cmp.Or(icfg.Logger, log)
	icfg.Schema = cfg.Schema
	if icfg.Registerer == nil {
		icfg.Registerer = reg
	}
	store, err := idempotency.New(cfg.Pool, icfg)
	if err != nil {
		return within("Idempotency", err)
	}
	s.store = store
	// The intake knows each adapter's rules (a mail policy, a target
	// policy, an allow-list): a payload outside them is refused at
	// enqueue, naming the field, instead of failing later.
	kinds := outbox.DefaultKinds()
	for _, r := range cfg.Adapters {
		kinds[r.Kind] = r.Spec
	}
	ob, err := outbox.New(cfg.Pool, outbox.Config{Schema: cfg.Schema, Kinds: kinds, KeyScope: cfg.KeyScope, LockTimeout: cfg.EnqueueLockTimeout, Logger: log, Registerer: s.registry,
		ListenPool: cfg.ListenPool, DisableListen: cfg.TransactionPooler})
	if err != nil {
		return err
	}
	s.outbox = ob
	return nil
}

// startAdapters probes the adapters and starts the idempotency sweeper and
// the adapter runtime.
func (s *Gateway) startAdapters(ctx context.Context, cfg Config, log *slog.Logger, reg *prometheus.Registry) error {
	var execs []adapters.Executor
	for _, r := range cfg.Adapters {
		if r.Executor == nil {
			continue
		}
		// Before anything is consumed: a destination that does not keep
		// what its adapter relies on must stop the start, not the first
		// effect.
		if r.Probe != nil {
			if err := r.Probe(ctx); err != nil {
				if m := errmap.Map(err); m.Code == errmap.InvalidInput {
					return m
				}
				// Named by its kind once: an adapter's own errors often
				// start with it ("s3: probe bucket …").
				msg := errmap.OneLine(err.Error())
				if !strings.HasPrefix(msg, r.Kind+": ") {
					msg = r.Kind + ": " + msg
				}
				return errmap.New(errmap.Unavailable, msg)
			}
		}
		execs = append(execs, r.Executor)
	}

	store, ob := s.store, s.outbox

	rcfg := cfg.runtimeConfig()
	rcfg.Executors = execs
	if rcfg.Registerer == nil {
		rcfg.Registerer = reg
	}
	rcfg.Logger = cmp.Or(rcfg.Logger, log)
	rcfg.Namespace = string(s.ns)
	rcfg.Schema = cfg.Schema
	rt, err := executor.NewRuntime(cfg.Pool, s.nc, store, ob, rcfg)
	if err != nil {
		return within("Runtime", err)
	}

	// The sweeper forgets completed keys past their retention; it only
	// matters where keys are made, so it runs with the adapters.
	sw := idempotency.NewSweeper(store)
	if err := sw.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	s.sweeper = sw
	s.parts.Add("idempotency_sweeper", sw.Stop, sw.Stopped())

	// Start waits for the stream until ctx ends: adapters started before
	// any dispatcher (or while NATS is down) wait here.
	if err := rt.Start(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.runtime = rt
	for _, e := range execs {
		s.consumers = append(s.consumers, consumer{kind: e.Kind(), durable: rt.Durable(e.Kind())})
	}
	s.mu.Unlock()
	// Stopped last: in-flight executions finish before the sweeper, the
	// dispatcher and the NATS connection go.
	s.parts.Add("adapters", rt.Stop, rt.Stopped())
	return nil
}
