// Package policy is fencegate's rule set: the principals that may enqueue
// and hold leases, what each may touch, and which PostgreSQL roles act as
// which principal. The rules live in the database (fencegate's schema),
// written as a whole by Apply (gateway policy apply FILE), read by Current
// (gateway policy show), and checked inside the database by the SQL
// interface's functions, so that a worker's role can do nothing its
// principal may not.
//
// A document is JSON (or the same in YAML):
//
//	{"principals": [
//	  {"name": "reports", "role": "worker",
//	   "resources": ["reports/*"], "kinds": ["email"],
//	   "key_scope": "resource", "sql_roles": ["report_worker"]}
//	]}
//
// Apply replaces every principal in one transaction and keeps every
// document applied (with who applied it) in the history: a rule set is
// never half applied, and what was in force when is on record.
package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"sigs.k8s.io/yaml"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/durable"
	"github.com/fencegate/fencegate/internal/pgschema"
)

// Roles a principal may have.
const (
	// RoleWorker enqueues and holds leases.
	RoleWorker = "worker"
	// RoleOperator reads intents and acts on them; it does not enqueue.
	RoleOperator = "operator"
)

// Key scopes.
const (
	// KeyScopeResource confines a principal's idempotency keys to each
	// resource: the same key under two resources is two keys. The default:
	// a principal confined to some resources cannot take another's keys.
	KeyScopeResource = "resource"
	// KeyScopeGlobal shares one key space across resources.
	KeyScopeGlobal = "global"
)

// All, as a principal's only resource or kind, allows every one.
const All = "*"

// Document is a rule set as a team keeps it in git.
type Document struct {
	Principals []Principal `json:"principals"`
	// Destinations are where each built-in kind's effects may go, checked
	// at every enqueue (Go, CLI, HTTP, SQL) in the database; a kind left
	// out is not confined here (the adapter's own flags still are, at
	// execute).
	Destinations Destinations `json:"destinations,omitzero"`
}

// Destinations are the destination policies of the built-in kinds.
type Destinations struct {
	Email   *EmailRules   `json:"email,omitempty"`
	Webhook *WebhookRules `json:"webhook,omitempty"`
	File    *FileRules    `json:"file,omitempty"`
	S3      *S3Rules      `json:"s3,omitempty"`
}

// EmailRules confine mail: Senders are the allowed From addresses
// ("reports@example.com", exact, case-insensitive) or domains
// ("example.com": an address at exactly that domain); RecipientDomains the
// domains To, Cc and Bcc may be at (exact). An empty list does not
// confine.
type EmailRules struct {
	Senders          []string `json:"senders,omitempty"`
	RecipientDomains []string `json:"recipient_domains,omitempty"`
}

// WebhookRules confine webhooks: Hosts are "host" (any port) or
// "host:port" (the URL's port, or 80/443 by its scheme), for url and
// lookup_url; names match case-insensitively, exactly; IP addresses by
// value. Required when the kind is listed.
type WebhookRules struct {
	Hosts []string `json:"hosts"`
}

// FileRules confine file targets: Targets are patterns of the whole
// target, with "*" (any run of characters but "/") and "?" (one of them),
// or "dir/**" for anything under dir. Required when the kind is listed.
type FileRules struct {
	Targets []string `json:"targets"`
}

// S3Rules confine s3 buckets: a payload naming a bucket must name one of
// Buckets (a payload naming none goes to the gateway's --s3-bucket).
// Required when the kind is listed.
type S3Rules struct {
	Buckets []string `json:"buckets"`
}

// Principal is who a token or a PostgreSQL role acts as.
type Principal struct {
	// Name identifies the principal: 1 to 64 of a-z, 0-9, '.', '_', '-'.
	Name string `json:"name"`
	// Role is RoleWorker or RoleOperator.
	Role string `json:"role"`
	// Resources the principal may touch: exact names or "prefix*"
	// patterns; ["*"] for every resource. Required.
	Resources []string `json:"resources"`
	// Kinds the principal may enqueue; ["*"] for every kind. Required for
	// a worker.
	Kinds []string `json:"kinds,omitempty"`
	// Epochs allows advancing a resource's epoch from outside (an external
	// lock service). Default false.
	Epochs bool `json:"epochs,omitempty"`
	// KeyScope is KeyScopeResource (default) or KeyScopeGlobal.
	KeyScope string `json:"key_scope,omitempty"`
	// SQLRoles are the PostgreSQL roles (session_user) that act as this
	// principal through the SQL interface. A role belongs to one principal.
	SQLRoles []string `json:"sql_roles,omitempty"`
}

// Parse reads a document: JSON, or YAML (read as the JSON it spells),
// unknown fields refused. An error is a *fenceerr.InvalidError naming the
// field ("principals[1].resources[0]").
func Parse(b []byte) (Document, error) {
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] != '{' {
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			return Document{}, fenceerr.Invalid("document", "is neither JSON nor YAML: %v", err)
		}
		b = j
	}
	if err := unknownFields(b); err != nil {
		return Document{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d Document
	if err := dec.Decode(&d); err != nil {
		return Document{}, parseError(err)
	}
	if dec.More() {
		return Document{}, fenceerr.Invalid("document", "must hold one JSON object, found more after it")
	}
	d = d.withDefaults()
	if err := d.Validate(); err != nil {
		return Document{}, err
	}
	return d, nil
}

// principalFields are the fields of a principal, as JSON names them.
var principalFields = []string{"name", "role", "resources", "kinds", "epochs", "key_scope", "sql_roles"}

// destinationFields are the fields of each kind's destination rules.
var destinationFields = map[string][]string{
	"email":   {"senders", "recipient_domains"},
	"webhook": {"hosts"},
	"file":    {"targets"},
	"s3":      {"buckets"},
}

// unknownFields refuses a field the document format does not have, named
// by its path ("principals[0].token"): a misspelt field must not leave a
// rule out silently.
func unknownFields(b []byte) error {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return nil // not an object: Decode says so
	}
	for k := range top {
		if k != "principals" && k != "destinations" {
			return fenceerr.Invalid(k, "is not a field of a policy document (principals, destinations)")
		}
	}
	var dests map[string]map[string]json.RawMessage
	if json.Unmarshal(top["destinations"], &dests) == nil {
		for kind, rules := range dests {
			fields, ok := destinationFields[kind]
			if !ok {
				return fenceerr.Invalid("destinations."+kind, "is not a kind with destination rules (email, webhook, file, s3)")
			}
			for k := range rules {
				if !slices.Contains(fields, k) {
					return fenceerr.Invalid("destinations."+kind+"."+k, "is not a field of %s's rules (%s)", kind, strings.Join(fields, ", "))
				}
			}
		}
	}
	var ps []map[string]json.RawMessage
	if json.Unmarshal(top["principals"], &ps) != nil {
		return nil
	}
	for i, p := range ps {
		for k := range p {
			if !slices.Contains(principalFields, k) {
				return fenceerr.Invalid(fmt.Sprintf("principals[%d].%s", i, k), "is not a field of a principal (%s)", strings.Join(principalFields, ", "))
			}
		}
	}
	return nil
}

// indexRE finds the array indexes of encoding/json's field paths.
var indexRE = regexp.MustCompile(`\.([0-9]+)`)

// parseError names the field of a JSON error where it can, in the
// documents' own spelling ("principals[0].name").
func parseError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fenceerr.Invalid(indexRE.ReplaceAllString(te.Field, "[$1]"), "must be a %s, got %s", te.Type, te.Value)
	}
	return fenceerr.Invalid("document", "is not valid JSON: %v", err)
}

func (d Document) withDefaults() Document {
	for i := range d.Principals {
		if d.Principals[i].KeyScope == "" {
			d.Principals[i].KeyScope = KeyScopeResource
		}
	}
	return d
}

var (
	nameRE = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)
	roleRE = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)
)

// ValidName reports whether name can be a principal's name.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Validate checks d; its errors name the field.
func (d Document) Validate() error {
	if err := d.Destinations.validate(); err != nil {
		return err
	}
	if len(d.Principals) == 0 {
		// Applied, it would refuse every worker, SQL role and token, and a
		// rule set stays in force until another is applied.
		return fenceerr.Invalid("principals", "must list at least one principal: a rule set without any refuses every worker, SQL role and token")
	}
	names := map[string]bool{}
	roles := map[string]string{}
	for i, p := range d.Principals {
		at := fmt.Sprintf("principals[%d]", i)
		switch {
		case !nameRE.MatchString(p.Name):
			return fenceerr.Invalid(at+".name", "must be 1 to 64 of a-z, 0-9, '.', '_', '-', got %q", p.Name)
		case names[p.Name]:
			return fenceerr.Invalid(at+".name", "%q names two principals", p.Name)
		case p.Role != RoleWorker && p.Role != RoleOperator:
			return fenceerr.Invalid(at+".role", "must be %q or %q, got %q", RoleWorker, RoleOperator, p.Role)
		case p.KeyScope != KeyScopeResource && p.KeyScope != KeyScopeGlobal:
			return fenceerr.Invalid(at+".key_scope", "must be %q or %q, got %q", KeyScopeResource, KeyScopeGlobal, p.KeyScope)
		case len(p.Resources) == 0:
			return fenceerr.Invalid(at+".resources", `must list the resources the principal may touch (exact, "prefix*", or "*" for every one)`)
		case p.Role == RoleWorker && len(p.Kinds) == 0:
			return fenceerr.Invalid(at+".kinds", `must list the kinds the worker may enqueue ("*" for every one)`)
		}
		names[p.Name] = true
		for j, r := range p.Resources {
			if err := checkPattern(r); err != nil {
				return fenceerr.Invalid(fmt.Sprintf("%s.resources[%d]", at, j), "%v", err)
			}
		}
		for j, k := range p.Kinds {
			if err := checkPattern(k); err != nil || (strings.HasSuffix(k, "*") && k != All) {
				return fenceerr.Invalid(fmt.Sprintf("%s.kinds[%d]", at, j), `must be a kind's name or "*", got %q`, k)
			}
		}
		for j, r := range p.SQLRoles {
			field := fmt.Sprintf("%s.sql_roles[%d]", at, j)
			if !roleRE.MatchString(r) {
				return fenceerr.Invalid(field, "must be a PostgreSQL role's name (lower case, unquoted), got %q", r)
			}
			if other, ok := roles[r]; ok {
				return fenceerr.Invalid(field, "role %q is mapped to principals %q and %q: a role acts as one principal", r, other, p.Name)
			}
			roles[r] = p.Name
		}
	}
	return nil
}

// validate checks the destination rules; errors name the field.
func (d Destinations) validate() error {
	if e := d.Email; e != nil {
		for i, v := range e.Senders {
			if !emailRE.MatchString(v) && !domainRE.MatchString(v) {
				return fenceerr.Invalid(fmt.Sprintf("destinations.email.senders[%d]", i), "must be an address (local@domain) or a domain, got %q", v)
			}
		}
		for i, v := range e.RecipientDomains {
			if !domainRE.MatchString(v) {
				return fenceerr.Invalid(fmt.Sprintf("destinations.email.recipient_domains[%d]", i), "must be a domain, got %q", v)
			}
		}
	}
	if w := d.Webhook; w != nil {
		if len(w.Hosts) == 0 {
			return fenceerr.Invalid("destinations.webhook.hosts", "must list the hosts webhooks may go to")
		}
		for i, v := range w.Hosts {
			if !hostRE.MatchString(v) {
				// Not echoed: a host pasted as a URL may carry a password.
				return fenceerr.Invalid(fmt.Sprintf("destinations.webhook.hosts[%d]", i), `must be "host" or "host:port" (an IPv6 address in brackets; not a URL): the entry is not shown`)
			}
		}
	}
	if f := d.File; f != nil {
		if len(f.Targets) == 0 {
			return fenceerr.Invalid("destinations.file.targets", "must list the target patterns files may be published to")
		}
		for i, v := range f.Targets {
			if !targetRE.MatchString(strings.TrimSuffix(v, "/**")) {
				return fenceerr.Invalid(fmt.Sprintf("destinations.file.targets[%d]", i), `must be a pattern of letters, digits, "._-/" with "*" and "?", or "dir/**", got %q`, v)
			}
		}
	}
	if b := d.S3; b != nil {
		if len(b.Buckets) == 0 {
			return fenceerr.Invalid("destinations.s3.buckets", "must list the buckets objects may be written to")
		}
		for i, v := range b.Buckets {
			if !bucketRE.MatchString(v) {
				return fenceerr.Invalid(fmt.Sprintf("destinations.s3.buckets[%d]", i), "must be a bucket name (3-63 of a-z, 0-9, '.', '-'), got %q", v)
			}
		}
	}
	return nil
}

var (
	domainRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+$`)
	emailRE  = regexp.MustCompile(`^[A-Za-z0-9.!#$%&'*+/=?^_{|}~-]+@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+$`)
	// hostRE: a DNS name or IPv4 address, or a bracketed IPv6 address,
	// with an optional port.
	hostRE   = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$`)
	targetRE = regexp.MustCompile(`^[A-Za-z0-9._*?/-]+$`)
	bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
)

// rows returns the destination rules as destination_policies' rows.
func (d Destinations) rows() map[string]any {
	m := map[string]any{}
	if d.Email != nil {
		m["email"] = d.Email
	}
	if d.Webhook != nil {
		m["webhook"] = d.Webhook
	}
	if d.File != nil {
		m["file"] = d.File
	}
	if d.S3 != nil {
		m["s3"] = d.S3
	}
	return m
}

// checkPattern checks a resource name or pattern: 1 to 200 bytes, no
// control, format or bidi characters, "*" only at the end.
func checkPattern(p string) error {
	if p == "" || len(p) > 200 {
		return fmt.Errorf("must be 1 to 200 bytes, got %d", len(p))
	}
	for _, r := range p {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return fmt.Errorf("must not hold control or format characters, got %q", p)
		}
	}
	if i := strings.IndexByte(p, '*'); i >= 0 && i != len(p)-1 {
		return fmt.Errorf(`may hold "*" only at its end, got %q`, p)
	}
	return nil
}

// Applied is one document on record.
type Applied struct {
	Version   int64     `json:"version"`
	AppliedAt time.Time `json:"applied_at"`
	AppliedBy string    `json:"applied_by"`
	Document  Document  `json:"document"`
}

// Apply replaces the rule set of schema with d, in one transaction, and
// records d in the history, applied by the database role it runs as
// (session_user). It returns the new version. A nil pool is a
// *fenceerr.InvalidError naming pool.
func Apply(ctx context.Context, pool *pgxpool.Pool, schema string, d Document) (int64, error) {
	if pool == nil {
		return 0, nilPool()
	}
	s, err := pgschema.Parse(schema)
	if err != nil {
		return 0, err
	}
	d = d.withDefaults()
	if err := d.Validate(); err != nil {
		return 0, err
	}
	doc, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	var version int64
	// A rule set decides authority: committed durably whatever the
	// session's synchronous_commit (behind a pooler the session setting of
	// durable.ConfigurePool may be on another server connection).
	err = durable.InTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		// One applier at a time: two applies racing would interleave their
		// deletes and inserts, and the history's order must be the order
		// in which rule sets took effect.
		if _, err := tx.Exec(ctx, s.SQL(`LOCK TABLE fencegate.policy_history IN EXCLUSIVE MODE`)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.SQL(`DELETE FROM fencegate.principals`)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.SQL(`DELETE FROM fencegate.destination_policies`)); err != nil {
			return err
		}
		for kind, rules := range d.Destinations.rows() {
			b, err := json.Marshal(rules)
			if err != nil {
				return err
			}
			// As text, not []byte: in the exec and simple_protocol query
			// modes (PgBouncer's) pgx sends a []byte as bytea, which jsonb
			// refuses.
			if _, err := tx.Exec(ctx, s.SQL(`INSERT INTO fencegate.destination_policies (kind, rules) VALUES ($1, $2)`), kind, string(b)); err != nil {
				return err
			}
		}
		for _, p := range d.Principals {
			if _, err := tx.Exec(ctx, s.SQL(`INSERT INTO fencegate.principals (name, role, resource_patterns, kinds, epochs, key_scope)
				VALUES ($1, $2, $3, $4, $5, $6)`), p.Name, p.Role, p.Resources, nonNil(p.Kinds), p.Epochs, p.KeyScope); err != nil {
				return err
			}
			for _, r := range p.SQLRoles {
				if _, err := tx.Exec(ctx, s.SQL(`INSERT INTO fencegate.principal_roles (role_name, principal) VALUES ($1, $2)`), r, p.Name); err != nil {
					return err
				}
			}
		}
		return tx.QueryRow(ctx, s.SQL(`INSERT INTO fencegate.policy_history (applied_by, document) VALUES (session_user, $1) RETURNING version`),
			string(doc)).Scan(&version)
	})
	if err != nil {
		return 0, fmt.Errorf("policy: apply: %w", err)
	}
	return version, nil
}

// nilPool is the refusal of a nil pool.
func nilPool() error { return fenceerr.Invalid("pool", "must not be nil") }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Current returns the rule set in force in schema: the last document
// applied. ok is false when none was ever applied. A nil pool is a
// *fenceerr.InvalidError naming pool.
func Current(ctx context.Context, pool *pgxpool.Pool, schema string) (a Applied, ok bool, err error) {
	if pool == nil {
		return Applied{}, false, nilPool()
	}
	s, err := pgschema.Parse(schema)
	if err != nil {
		return Applied{}, false, err
	}
	var doc []byte
	err = pool.QueryRow(ctx, s.SQL(`SELECT version, applied_at, applied_by, document FROM fencegate.policy_history
		ORDER BY version DESC LIMIT 1`)).Scan(&a.Version, &a.AppliedAt, &a.AppliedBy, &doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return Applied{}, false, nil
	}
	if err != nil {
		return Applied{}, false, fmt.Errorf("policy: %w", err)
	}
	if err := json.Unmarshal(doc, &a.Document); err != nil {
		return Applied{}, false, fmt.Errorf("policy: the document on record: %w", err)
	}
	return a, true, nil
}

// Allows reports whether pattern (a principal's resource entry) covers
// resource.
func Allows(pattern, resource string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(resource, prefix)
	}
	return pattern == resource
}

// Covers reports whether one of patterns covers resource.
func Covers(patterns []string, resource string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return Allows(p, resource) })
}
