// Package pgschema names the PostgreSQL schema fencegate's tables and
// functions live in, and qualifies fencegate's SQL for it.
//
// fencegate lives inside the application's database, next to tables of the
// application's own: an application may well have a table called intents
// or resources in public. So every statement fencegate's Go code runs names
// its objects with their schema, whatever the connection's search_path is
// (a worker's EnqueueTx runs in the worker's transaction, on the worker's
// pool), and every function the migrations create has its search_path
// pinned (migrations.Up), so that a function called from any session reads
// fencegate's tables and never an application's table of the same name.
//
// The Go code writes its SQL for the default schema, with the objects
// qualified as "fencegate.intents"; Schema.SQL rewrites those names for
// another schema. Only the names of fencegate's objects are rewritten
// (Objects): "fencegate.principal" (a setting) or "fencegate.enqueue" in a
// comment elsewhere stay as they are.
package pgschema

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Default is the schema fencegate uses unless told otherwise (--schema,
// $GATEWAY_SCHEMA, Schema in a Go config).
const Default = "fencegate"

// MaxLen bounds a schema's name: its notification channels
// (<schema>_intents, <schema>_outcomes) must fit PostgreSQL's 63-byte
// identifiers.
const MaxLen = 40

// nameRE is what a schema's name may be: a plain lower-case identifier, so
// it never needs quoting and can never carry SQL of its own.
var nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Objects are the names of fencegate's objects in its schema that Go code
// names in SQL: tables, sequences and functions. TestObjectsAreTheSchemas
// checks the list against a migrated database.
var Objects = []string{
	// tables
	"deployment", "epoch_authority", "epoch_grants", "fencegate_schema_version",
	"destination_policies", "idempotency_keys", "intent_attempts", "intent_events", "intents", "policy_history",
	"principal_roles", "principals", "resources",
	// sequences
	"fencegate_schema_version_id_seq", "idempotency_token_seq",
	"intent_events_event_id_seq", "intents_intent_id_seq", "policy_history_version_seq",
	"fence_count_sql_stale_epoch", "fence_count_sql_lease_held", "fence_count_sql_forbidden",
	"fence_count_sql_takeover_free", "fence_count_sql_takeover_after_expiry", "fence_count_sql_takeover_released",
	"fence_count_sql_takeover_reacquired", "fence_count_cli_stale_epoch", "fence_count_cli_lease_held",
	"fence_count_cli_forbidden", "fence_count_cli_takeover_free", "fence_count_cli_takeover_after_expiry",
	"fence_count_cli_takeover_released", "fence_count_cli_takeover_reacquired", "fence_count_cli_takeover_external_advance",
	// functions: the stable SQL interface (migrations/functions/interface_v1.sql, docs/sql.md)
	"acquire", "enqueue", "interface_version", "release", "renew",
	// functions: internal
	"fencegate_authorize", "fencegate_base64_ok", "fencegate_blank", "fencegate_check_content", "fencegate_check_destination",
	"fencegate_check_id", "fencegate_check_lease_args", "fencegate_count", "fencegate_check_principal", "fencegate_check_payload",
	"fencegate_check_target", "fencegate_check_url", "fencegate_deployment_sysid", "fencegate_derived_namespace",
	"fencegate_email_address_ok", "fencegate_enqueue", "fencegate_enqueue_batch",
	"fencegate_epoch_authority", "fencegate_epoch_never_decreases", "fencegate_invalid",
	"fencegate_notify_outcome", "fencegate_payload_only", "fencegate_payload_string",
	"fencegate_payload_string_map", "fencegate_payload_strings", "fencegate_principal_allows",
	"fencegate_raise", "fencegate_resource_key", "fencegate_rule_set_applied", "fencegate_rules", "fencegate_s3_reserved_key", "fencegate_scoped_key", "fencegate_scoped_shape", "fencegate_stale_lease", "fencegate_system_identifier",
	"fencegate_timeline_id", "fencegate_url_ok",
}

// Check reports whether name can be a schema of fencegate's: 1 to MaxLen
// bytes of lower-case letters, digits and underscores, not starting with
// a digit, not one of PostgreSQL's own schemas, and not a reserved word of
// SQL. The error names the field "schema".
func Check(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("schema: must not be empty")
	case len(name) > MaxLen:
		return fmt.Errorf("schema: must be at most %d bytes, got %d", MaxLen, len(name))
	case !nameRE.MatchString(name):
		return fmt.Errorf("schema: %q must be a lower-case identifier (a-z, 0-9, _; not starting with a digit)", name)
	case strings.HasPrefix(name, "pg_") || name == "information_schema":
		return fmt.Errorf("schema: %q is one of PostgreSQL's own schemas", name)
	case reserved[name]:
		return fmt.Errorf("schema: %q is a reserved word of SQL, which cannot name a schema unquoted; choose another name", name)
	}
	return nil
}

// reserved are PostgreSQL's keywords that cannot name a schema without
// quotes (pg_get_keywords(), catcode R and T, of PostgreSQL 15, and
// system_user of 16): fencegate's SQL names its schema unquoted, so
// CREATE SCHEMA user would be a syntax error at migrate time.
var reserved = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`all analyse analyze and any array as asc asymmetric authorization binary both
		case cast check collate collation column concurrently constraint create cross current_catalog current_date
		current_role current_schema current_time current_timestamp current_user default deferrable desc distinct do
		else end except false fetch for foreign freeze from full grant group having ilike in initially inner intersect
		into is isnull join lateral leading left like limit localtime localtimestamp natural not notnull null offset on
		only or order outer overlaps placing primary references returning right select session_user similar some
		symmetric system_user table tablesample then to trailing true union unique user using variadic verbose when
		where window with`) {
		m[w] = true
	}
	return m
}()

// Schema is a checked schema name. The zero value is the default schema.
type Schema struct {
	name string
	// cache holds SQL already rewritten for this schema, so that a hot
	// statement is rewritten once per process, not once per call. Nil for
	// the default schema, whose SQL needs no rewriting.
	cache *sync.Map
}

// schemas shares one Schema (and its cache) per name in a process.
var schemas sync.Map // name -> Schema

// Parse checks name and returns its Schema; "" is the default schema.
func Parse(name string) (Schema, error) {
	if name == "" || name == Default {
		return Schema{}, nil
	}
	if err := Check(name); err != nil {
		return Schema{}, err
	}
	if s, ok := schemas.Load(name); ok {
		return s.(Schema), nil
	}
	s, _ := schemas.LoadOrStore(name, Schema{name: name, cache: new(sync.Map)})
	return s.(Schema), nil
}

// MustParse is Parse for names known to be valid; it panics on a bad one.
func MustParse(name string) Schema {
	s, err := Parse(name)
	if err != nil {
		panic(err)
	}
	return s
}

// Name is the schema's name.
func (s Schema) Name() string {
	if s.name == "" {
		return Default
	}
	return s.name
}

// String is Name.
func (s Schema) String() string { return s.Name() }

// IsDefault reports whether s is the default schema.
func (s Schema) IsDefault() bool { return s.name == "" }

// IntentsChannel is the channel the enqueue functions NOTIFY at commit and
// dispatchers LISTEN on: fencegate_intents in the default schema. One per
// schema, so that two deployments in one database do not wake each other.
func (s Schema) IntentsChannel() string { return s.Name() + "_intents" }

// OutcomesChannel is the channel the intents' outcome trigger NOTIFYs and
// outbox.Client.Wait LISTENs on: fencegate_outcomes in the default schema.
func (s Schema) OutcomesChannel() string { return s.Name() + "_outcomes" }

// Qualify returns object qualified with the schema: "fencegate.intents".
func (s Schema) Qualify(object string) string { return s.Name() + "." + object }

// SQL returns query with each of fencegate's objects named
// "fencegate.<object>" renamed into s. For the default schema it is query
// itself.
func (s Schema) SQL(query string) string {
	if s.name == "" {
		return query
	}
	if q, ok := s.cache.Load(query); ok {
		return q.(string)
	}
	q := rewrite(query, s.name)
	s.cache.Store(query, q)
	return q
}

const prefix = Default + "."

// rewrite renames "fencegate.<object>" for the objects of Objects, where
// the name is a whole identifier (not "fencegate.intentsx", nor
// "xfencegate.intents").
func rewrite(query, name string) string {
	var b strings.Builder
	rest := query
	for {
		i := strings.Index(rest, prefix)
		if i < 0 {
			break
		}
		j := i + len(prefix)
		k := j
		for k < len(rest) && isIdent(rest[k]) {
			k++
		}
		if (i == 0 || !isIdent(rest[i-1])) && slices.Contains(Objects, rest[j:k]) {
			b.WriteString(rest[:i])
			b.WriteString(name)
			b.WriteByte('.')
		} else {
			b.WriteString(rest[:j])
		}
		rest = rest[j:]
	}
	if b.Len() == 0 {
		return query
	}
	b.WriteString(rest)
	return b.String()
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// Missing reports whether err is PostgreSQL's answer to a statement
// naming a table, function or schema that does not exist (SQLSTATE 42P01
// undefined_table, 42883 undefined_function, 3F000 invalid_schema_name):
// for fencegate's statements, the schema was never migrated, or is another
// one.
func Missing(err error) bool {
	var pe interface{ SQLState() string }
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.SQLState() {
	case "42P01", "42883", "3F000":
		return true
	}
	return false
}
