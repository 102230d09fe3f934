package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrAuthorityChanged is returned (wrapped in *AuthorityError) when a grant
// (Acquire, Advance) runs on a database that is not the epoch authority on
// record: its system identifier is not the one that granted the epochs so
// far (another database, a copy restored into another cluster, a
// pg_upgrade), or its WAL timeline is lower than the one recorded (a
// restore from an older backup). Such a database may lack grants the
// authority made, and nothing in it tells how many, so it could hand out
// an epoch twice. Nothing was granted or changed; retrying does not help
// until an operator accepts the database (docs/guarantees.md, "After a
// failover"). A higher timeline (a promotion) is not refused: the grant
// raises every epoch instead (WithFailoverEpochJump).
var ErrAuthorityChanged = errors.New("the database is not the epoch authority on record")

// The reasons of an AuthorityError.
const (
	// ReasonSystemIdentifierChanged: the database's system identifier is
	// not the recorded one.
	ReasonSystemIdentifierChanged = "system_identifier_changed"
	// ReasonTimelineBackwards: the database's timeline is lower than the
	// recorded one.
	ReasonTimelineBackwards = "timeline_backwards"
)

// AuthorityError says why a grant was refused (ErrAuthorityChanged): what
// was recorded and what the database is now.
type AuthorityError struct {
	// Op is the grant: acquire or advance.
	Op       string
	Resource string
	// Reason is ReasonSystemIdentifierChanged or ReasonTimelineBackwards.
	Reason                   string
	RecordedSystemIdentifier int64
	SystemIdentifier         int64
	RecordedTimeline         int64
	Timeline                 int64
}

func (e *AuthorityError) Error() string {
	what := fmt.Sprintf("the database's system identifier changed (recorded %d, now %d): "+
		"this is a different database, or a copy of it (a restore into another cluster, pg_upgrade)",
		e.RecordedSystemIdentifier, e.SystemIdentifier)
	if e.Reason == ReasonTimelineBackwards {
		what = fmt.Sprintf("the database's timeline went backwards (recorded %d, now %d): "+
			"a restore from an older backup", e.RecordedTimeline, e.Timeline)
	}
	return fmt.Sprintf("lease: %s %q: refused, epoch authority changed: %s, which may lack epochs already granted "+
		"and could grant one twice; nothing was granted (see docs/guarantees.md, \"After a failover\", to accept this database)",
		e.Op, e.Resource, what)
}

// Is reports whether target is ErrAuthorityChanged.
func (e *AuthorityError) Is(target error) bool { return target == ErrAuthorityChanged }

// sqlstateAuthority is what fencegate_epoch_authority raises when it
// refuses (migrations/functions/epoch.sql).
const sqlstateAuthority = "ZF001"

// authorityError explains a refusal (SQLSTATE ZF001) of a grant: it reads
// what is recorded and what the database is now, in a statement of its own
// (the grant's transaction was rolled back, and the refusal changed
// nothing), rather than parsing the server's message.
func (i *Issuer) authorityError(ctx context.Context, op, resource string, cause error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	e := &AuthorityError{Op: op, Resource: resource}
	err := i.pool.QueryRow(cctx, i.schema.SQL(`
		SELECT a.system_identifier, fencegate.fencegate_system_identifier(), a.timeline_id, fencegate.fencegate_timeline_id()
		FROM fencegate.epoch_authority a`)).Scan(&e.RecordedSystemIdentifier, &e.SystemIdentifier, &e.RecordedTimeline, &e.Timeline)
	if err != nil {
		return fmt.Errorf("lease: %s: %w (and reading the epoch authority: %v)", op, cause, err)
	}
	e.Reason = ReasonTimelineBackwards
	if e.RecordedSystemIdentifier != e.SystemIdentifier {
		e.Reason = ReasonSystemIdentifierChanged
	}
	return e
}

func isAuthorityRefusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateAuthority
}
