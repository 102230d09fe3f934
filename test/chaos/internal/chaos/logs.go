package chaos

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
)

// InstallLogs adds the test-only commit-order logs to a chaos database
// whose fencegate tables are in schema (empty: the default):
// chaos.grant_log gets a row (resource, epoch, holder) in the transaction
// of every change of a resource's epoch, chaos.intent_log one in the
// transaction that inserted an intent (the intents row itself is updated
// later, so its xmin is not the inserting transaction's). With
// track_commit_timestamp on, their xmin commit timestamps order grants and
// intent commits. A row is lost exactly when its transaction is: a grant
// acknowledged to a worker and missing here was lost by the database.
//
// The logs live in a schema of their own and every name in the trigger
// functions is qualified, their search_path pinned: the triggers run
// inside fencegate's functions (enqueue, acquire), whose search_path is
// pinned to fencegate's schema, and inside the Go clients' statements,
// whose search_path is the session's. An unqualified name would resolve
// in one and fail in the other — and a failing trigger fails every
// enqueue.
func InstallLogs(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	s, err := pgschema.Parse(schema)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, s.SQL(`
		CREATE SCHEMA chaos;
		CREATE TABLE chaos.grant_log (resource_id text NOT NULL, epoch bigint NOT NULL, holder text);
		CREATE FUNCTION chaos.log_grant() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
		BEGIN
			IF NEW.epoch > 0 AND (TG_OP = 'INSERT' OR NEW.epoch <> OLD.epoch) THEN
				INSERT INTO chaos.grant_log VALUES (NEW.resource_id, NEW.epoch, NEW.holder);
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER chaos_log_grant AFTER INSERT OR UPDATE ON fencegate.resources FOR EACH ROW EXECUTE FUNCTION chaos.log_grant();
		CREATE TABLE chaos.intent_log (intent_id bigint NOT NULL, resource_id text NOT NULL, epoch bigint NOT NULL, operation_id text NOT NULL);
		CREATE FUNCTION chaos.log_intent() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
		BEGIN
			INSERT INTO chaos.intent_log VALUES (NEW.intent_id, NEW.resource_id, NEW.epoch, NEW.operation_id);
			RETURN NULL;
		END $$;
		CREATE TRIGGER chaos_log_intent AFTER INSERT ON fencegate.intents FOR EACH ROW EXECUTE FUNCTION chaos.log_intent();`))
	return err
}
