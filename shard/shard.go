// Package shard spreads resources over several PostgreSQL primaries: each
// primary is a deployment of its own (its own outbox, its own epoch
// authority, its own namespace on NATS), and a resource always lives on the
// same one, chosen by a stable function of its name that every worker, in
// any process, computes alike.
//
// The fence holds per shard: an epoch is only ever compared with epochs of
// the same resource, which all live on that resource's primary. A worker
// holding resource R talks only to R's primary — Router.For(R) — for its
// lease, its enqueues and its reads; nothing crosses shards. One NATS (or
// cluster) serves all shards: their namespaces keep their streams apart
// (run one `gateway run` set per primary; see docs/operations.md).
//
// The function is rendezvous (highest random weight) hashing over the
// shards' names: the shard whose SHA-256 of "<name>\x00<resource>" is the
// highest wins. It depends only on the set of names, not on their order,
// and adding or removing a shard moves only the resources that the change
// must move (about 1/n of them). Moving a resource between primaries is not
// automatic: see Router.
package shard

import (
	"bytes"
	"crypto/sha256"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Shard is one primary.
type Shard struct {
	// Name identifies the shard in the hash: keep it stable (renaming a
	// shard moves resources). Not the host name, which may change.
	Name string
	// Pool is the primary's pool.
	Pool *pgxpool.Pool
	// Outbox and Issuer are the primary's clients (New builds them when nil).
	Outbox *outbox.Client
	Issuer *lease.Issuer
}

// Router assigns resources to shards. It is safe for concurrent use.
//
// The set of shard names is the assignment: every worker and gateway must
// use the same set. Changing it (adding a primary) reassigns some
// resources to another primary, whose epochs for them start over; do it
// only for resources with no live lease and no intent in flight, or move a
// resource by advancing its epoch on the new primary past the old
// primary's before any worker uses it there (lease.Issuer.Advance).
type Router struct {
	shards []*Shard
}

// Config configures New.
type Config struct {
	// Schema is the PostgreSQL schema fencegate's tables live in on every
	// shard (gateway migrate --schema). Default: "fencegate"; Outbox.Schema,
	// when set, must be the same.
	Schema string
	// Outbox is the configuration of each shard's outbox client (when a
	// Shard has none).
	Outbox outbox.Config
	// IssuerOptions are each shard's issuer options (when it has none).
	IssuerOptions []lease.Option
}

// New returns a router over shards (at least one; names unique and not
// empty). Bad input is a *fenceerr.InvalidError naming the argument or
// the field ("shards[1].Name", "Outbox.KeyScope"), refused before any
// shard's outbox is made.
func New(shards []Shard, cfg Config) (*Router, error) {
	if len(shards) == 0 {
		return nil, invalid("shards", "at least one shard is required")
	}
	if cfg.Outbox.Schema == "" {
		cfg.Outbox.Schema = cfg.Schema
	}
	if cfg.Outbox.Schema != cfg.Schema {
		return nil, invalid("Outbox.Schema", "%q is not Schema %q", cfg.Outbox.Schema, cfg.Schema)
	}
	if err := cfg.Outbox.Validate(); err != nil {
		return nil, fmt.Errorf("shard: %w", fenceerr.Within("Outbox", err))
	}
	r := &Router{}
	seen := map[string]bool{}
	for i, s := range shards {
		switch {
		case s.Name == "":
			return nil, invalid(fmt.Sprintf("shards[%d].Name", i), "a shard needs a name")
		case seen[s.Name]:
			return nil, invalid(fmt.Sprintf("shards[%d].Name", i), "two shards named %q", s.Name)
		case s.Pool == nil && (s.Outbox == nil || s.Issuer == nil):
			return nil, invalid(fmt.Sprintf("shards[%d].Pool", i), "shard %q: a pool is required (or both an Outbox and an Issuer)", s.Name)
		}
		seen[s.Name] = true
		if s.Outbox == nil {
			ob, err := outbox.New(s.Pool, cfg.Outbox)
			if err != nil {
				return nil, fmt.Errorf("shard %q: %w", s.Name, err)
			}
			s.Outbox = ob
		}
		if s.Issuer == nil {
			s.Issuer = lease.NewIssuer(s.Pool, append([]lease.Option{lease.WithSchema(cfg.Schema)}, cfg.IssuerOptions...)...)
		}
		r.shards = append(r.shards, &s)
	}
	return r, nil
}

// invalid is bad input: a *fenceerr.InvalidError naming field.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("shard: %w", fenceerr.Invalid(field, format, args...))
}

// For returns the shard of resource: the one its lease, its intents and
// its epochs live on.
func (r *Router) For(resource string) *Shard {
	var best *Shard
	var bestSum [sha256.Size]byte
	for _, s := range r.shards {
		sum := weight(s.Name, resource)
		if best == nil || bytes.Compare(sum[:], bestSum[:]) > 0 {
			best, bestSum = s, sum
		}
	}
	return best
}

// Shards returns the shards, in the order given to New.
func (r *Router) Shards() []*Shard { return r.shards }

// weight is the shard's score for resource.
func weight(name, resource string) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(resource))
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}
