package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// How says how authority over a resource passed to a new epoch.
type How string

// The ways authority passes; the values are stored in epoch_grants.how and
// used as the "how" label of fencegate_lease_takeovers_total.
const (
	// HowFree: nobody held the resource here: it was never granted, or its
	// epoch last came from an external advance or a failover's raise.
	HowFree How = "free"
	// HowAfterExpiry: the previous holder's lease had expired by
	// PostgreSQL's clock (also when the same holder comes back after its
	// own lease expired: its old writes are fenced out too).
	HowAfterExpiry How = "after_expiry"
	// HowReleased: the previous holder released its lease.
	HowReleased How = "released"
	// HowReacquired: the holder that held the live lease acquired it again
	// and got a new epoch (every grant is a new fencing token): the writes
	// of its previous epoch are fenced out, like anyone else's.
	HowReacquired How = "reacquired"
	// HowExternalAdvance: an outside lock service's larger epoch was
	// registered with Advance; any lease held here was cleared.
	HowExternalAdvance How = "external_advance"
	// HowFailover: the first grant after a failover (the database's
	// timeline grew) raised the epoch by the failover jump, past anything
	// the old primary can have granted, and cleared any lease held here
	// (WithFailoverEpochJump). Recorded in the history only, with no
	// holder; not counted in fencegate_lease_takeovers_total.
	HowFailover How = "failover"
)

// Limits of History.
const (
	DefaultHistoryLimit = 100
	MaxHistoryLimit     = 1000
)

// Grant is one new epoch of a resource: granted by Acquire (also a
// same-holder re-acquire of a live lease, HowReacquired), registered by
// Advance, or raised by the first grant after a failover (HowFailover).
type Grant struct {
	Resource string
	Epoch    int64
	// Holder is empty for an external advance (authority is outside) and
	// a failover's raise (nobody holds the raised epoch).
	Holder string
	// GrantedAt is PostgreSQL's clock at the grant.
	GrantedAt time.Time
	How       How
	// PreviousEpoch is the epoch before this grant (0 for the first).
	PreviousEpoch int64
	// PreviousHolder is who held the resource here before, when known.
	PreviousHolder string
	// SincePreviousRenewal is how long after the previous holder's last
	// grant or renewal (PostgreSQL's clock) authority passed; nil without a
	// previous holder. For a takeover after expiry it is at least the TTL:
	// how much more is how long the resource sat unowned.
	SincePreviousRenewal *time.Duration
	// Principal is who asked for the grant through the admin API (a
	// token's name, WithPrincipal); empty otherwise.
	Principal string
}

type principalKey struct{}

// WithPrincipal returns ctx carrying who asks (an admin API token's
// name): grants made with it record it (Grant.Principal).
func WithPrincipal(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, principalKey{}, name)
}

// principalFor is who a grant with ctx is made for: WithPrincipal's, else
// AsPrincipal's; nil for none.
func (i *Issuer) principalFor(ctx context.Context) *string {
	if p := principalOf(ctx); p != nil {
		return p
	}
	if i.principal != "" {
		return &i.principal
	}
	return nil
}

func principalOf(ctx context.Context) *string {
	if v, ok := ctx.Value(principalKey{}).(string); ok && v != "" {
		return &v
	}
	return nil
}

// grantJSON is Grant's JSON form: durations in seconds, empty names left out.
type grantJSON struct {
	Resource                    string    `json:"resource"`
	Epoch                       int64     `json:"epoch"`
	Holder                      string    `json:"holder,omitempty"`
	GrantedAt                   time.Time `json:"granted_at"`
	How                         How       `json:"how"`
	PreviousEpoch               int64     `json:"previous_epoch"`
	PreviousHolder              string    `json:"previous_holder,omitempty"`
	SincePreviousRenewalSeconds *float64  `json:"since_previous_renewal_seconds,omitempty"`
	Principal                   string    `json:"principal,omitempty"`
}

// MarshalJSON writes the grant with snake_case names and
// SincePreviousRenewal as since_previous_renewal_seconds.
func (g Grant) MarshalJSON() ([]byte, error) {
	j := grantJSON{Resource: g.Resource, Epoch: g.Epoch, Holder: g.Holder, GrantedAt: g.GrantedAt,
		How: g.How, PreviousEpoch: g.PreviousEpoch, PreviousHolder: g.PreviousHolder, Principal: g.Principal}
	if g.SincePreviousRenewal != nil {
		s := g.SincePreviousRenewal.Seconds()
		j.SincePreviousRenewalSeconds = &s
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads the form MarshalJSON writes.
func (g *Grant) UnmarshalJSON(b []byte) error {
	var j grantJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*g = Grant{Resource: j.Resource, Epoch: j.Epoch, Holder: j.Holder, GrantedAt: j.GrantedAt,
		How: j.How, PreviousEpoch: j.PreviousEpoch, PreviousHolder: j.PreviousHolder, Principal: j.Principal}
	if j.SincePreviousRenewalSeconds != nil {
		d := time.Duration(*j.SincePreviousRenewalSeconds * float64(time.Second))
		g.SincePreviousRenewal = &d
	}
	return nil
}

func micros(us *int64) *time.Duration {
	if us == nil {
		return nil
	}
	d := time.Duration(*us) * time.Microsecond
	return &d
}

// acquireGrant describes the grant of epoch next to holder by Acquire, from
// the control row c as it was locked before the update.
func (i *Issuer) acquireGrant(ctx context.Context, tx pgx.Tx, resource, holder string, next int64, c control) (*Grant, error) {
	g := &Grant{Resource: resource, Epoch: next, Holder: holder, PreviousEpoch: c.epoch}
	switch {
	case c.live && c.holder != nil && *c.holder == holder:
		// The live holder acquired again (Acquire returned HeldError for
		// anyone else): a new epoch all the same, and its old one is fenced.
		g.How, g.PreviousHolder = HowReacquired, holder
		g.SincePreviousRenewal = micros(c.sinceRenewal)
	case c.holder != nil:
		// A holder is still named, so its lease is not live (Acquire
		// returned HeldError otherwise) or it is our own expired lease.
		g.How, g.PreviousHolder = HowAfterExpiry, *c.holder
		g.SincePreviousRenewal = micros(c.sinceRenewal)
	case c.epoch == 0:
		g.How = HowFree
	default:
		// Nobody holds it: released, or cleared by an external advance.
		// The grant of the current epoch tells which (and who released).
		var how How
		var prev *string
		err := tx.QueryRow(ctx, i.schema.SQL(`SELECT how, holder FROM fencegate.epoch_grants WHERE resource_id = $1 AND epoch = $2`),
			resource, c.epoch).Scan(&how, &prev)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Granted before the history existed: a renewal means a lease
			// was held and released.
			g.How = HowFree
			if c.sinceRenewal != nil {
				g.How = HowReleased
				g.SincePreviousRenewal = micros(c.sinceRenewal)
			}
		case err != nil:
			return nil, fmt.Errorf("read previous grant: %w", err)
		case how == HowExternalAdvance || how == HowFailover:
			// Authority came from outside, or the epoch was raised away
			// from its holder by a failover: nobody held this epoch here.
			g.How = HowFree
		default:
			g.How = HowReleased
			if prev != nil {
				g.PreviousHolder = *prev
			}
			g.SincePreviousRenewal = micros(c.sinceRenewal)
		}
	}
	return g, nil
}

// recordGrant writes g into epoch_grants, in the grant's own transaction, and
// fills in GrantedAt (PostgreSQL's clock: the same now() the grant used).
func (i *Issuer) recordGrant(ctx context.Context, tx pgx.Tx, g *Grant) error {
	var holder, prev *string
	if g.Holder != "" {
		holder = &g.Holder
	}
	if g.PreviousHolder != "" {
		prev = &g.PreviousHolder
	}
	var since *int64
	if g.SincePreviousRenewal != nil {
		us := g.SincePreviousRenewal.Microseconds()
		since = &us
	}
	err := tx.QueryRow(ctx, i.schema.SQL(`
		INSERT INTO fencegate.epoch_grants (resource_id, epoch, holder, how, previous_epoch, previous_holder, since_previous_renewal, principal)
		VALUES ($1, $2, $3, $4, $5, $6, $7 * interval '1 microsecond', $8)
		RETURNING granted_at`),
		g.Resource, g.Epoch, holder, string(g.How), g.PreviousEpoch, prev, since, i.principalFor(ctx)).Scan(&g.GrantedAt)
	if p := i.principalFor(ctx); p != nil {
		g.Principal = *p
	}
	if err != nil {
		return fmt.Errorf("record grant: %w", err)
	}
	return nil
}

// History returns the resource's grants, newest first, at most limit of
// them (limit 0: DefaultHistoryLimit). An unknown resource has no grants.
// It only reads, so it also works against a standby (which may lag).
func (i *Issuer) History(ctx context.Context, resource string, limit int) ([]Grant, error) {
	if err := i.usable(); err != nil {
		return nil, err
	}
	if err := ValidateResource(resource); err != nil {
		return nil, err
	}
	if limit == 0 {
		limit = DefaultHistoryLimit
	}
	if limit < 0 || limit > MaxHistoryLimit {
		return nil, &InvalidError{Field: "limit", Message: fmt.Sprintf("must be between 1 and %d, got %d", MaxHistoryLimit, limit)}
	}
	rows, err := i.pool.Query(ctx, i.schema.SQL(`
		SELECT epoch, holder, granted_at, how, previous_epoch, previous_holder,
		       (extract(epoch FROM since_previous_renewal) * 1000000)::bigint, coalesce(principal, '')
		FROM fencegate.epoch_grants WHERE resource_id = $1
		ORDER BY epoch DESC LIMIT $2`), resource, limit)
	if err != nil {
		return nil, i.wrap(ctx, "history", err)
	}
	grants := []Grant{}
	for rows.Next() {
		g := Grant{Resource: resource}
		var holder, prev *string
		var since *int64
		if err := rows.Scan(&g.Epoch, &holder, &g.GrantedAt, &g.How, &g.PreviousEpoch, &prev, &since, &g.Principal); err != nil {
			rows.Close()
			return nil, i.wrap(ctx, "history", err)
		}
		if holder != nil {
			g.Holder = *holder
		}
		if prev != nil {
			g.PreviousHolder = *prev
		}
		g.SincePreviousRenewal = micros(since)
		grants = append(grants, g)
	}
	if err := rows.Err(); err != nil {
		return nil, i.wrap(ctx, "history", err)
	}
	return grants, nil
}
