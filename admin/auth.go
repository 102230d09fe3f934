package admin

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/policy"
)

// Role is what a token may do.
type Role string

// Roles.
const (
	// RoleWorker reaches the worker intake: leases, epochs, enqueue.
	RoleWorker Role = "worker"
	// RoleOperator reaches the reads, the actions on intents and /metrics.
	// It does not reach the intake: an operator who must act as a worker
	// configures a worker token too, so every enqueue is attributable to a
	// worker credential.
	RoleOperator Role = "operator"
)

// EnvTokens is the environment variable TokensFromEnv reads:
// "name:role:token,name:role:token".
const EnvTokens = "GATEWAY_TOKENS"

// MinTokenLen is the shortest secret accepted, in bytes.
const MinTokenLen = 16

// MinTokenDistinct is the fewest different bytes a secret may have.
const MinTokenDistinct = 8

// weakSecret says why a secret is too easy to guess, or "" when it is not
// refused. The rule is deliberately simple and predictable: at least
// MinTokenLen bytes, at least MinTokenDistinct different bytes, not one
// shorter unit repeated ("abcabc…", "password1password1"), and not a run
// of bytes with one step ("abcdef…", "0123…", "zyxw…"). It catches the
// secrets people type, not every weak one: make secrets with `gateway
// token new` (256 random bits). A random secret of 128 bits or more in hex
// or base64 passes it (in hex, 8 distinct of 16 digits in 32).
func weakSecret(secret string) string {
	b := []byte(secret)
	if len(b) < MinTokenLen {
		return fmt.Sprintf("must be at least %d bytes", MinTokenLen)
	}
	var seen [256]bool
	distinct := 0
	for _, c := range b {
		if !seen[c] {
			seen[c] = true
			distinct++
		}
	}
	if distinct < MinTokenDistinct {
		return fmt.Sprintf("has only %d different byte values; at least %d are needed", distinct, MinTokenDistinct)
	}
	for unit := 1; unit <= len(b)/2; unit++ {
		if bytes.Equal(b[unit:], b[:len(b)-unit]) {
			return "repeats one shorter unit"
		}
	}
	step := int(b[1]) - int(b[0])
	run := true
	for i := 2; i < len(b) && run; i++ {
		run = int(b[i])-int(b[i-1]) == step
	}
	if run {
		return "is a run of bytes with one step"
	}
	return ""
}

// Token is one bearer token. Name identifies it in logs and in intents'
// history (the actor); Secret is what clients send.
type Token struct {
	Name   string `json:"name"`
	Role   Role   `json:"role"`
	Secret string `json:"token"`
	// Resources confines the token to these resources: exact names, or
	// "prefix*" patterns. None: every resource.
	Resources []string `json:"resources,omitempty"`
	// Kinds confines the token's enqueues to these intent kinds. None:
	// every kind.
	Kinds []string `json:"kinds,omitempty"`
	// Epochs allows POST /api/v1/epochs (an external lock service's
	// advance, which clears a live holder's lease). Default: no.
	Epochs bool `json:"epochs,omitempty"`
	// Principal is the principal of the rule set (package policy) the
	// token's leases and enqueues are made as, recorded with them and,
	// once a rule set is applied, checked against it in the database.
	// Empty: the token's name.
	Principal string `json:"principal,omitempty"`
}

// Scope is what a token may touch (Token.Resources, Kinds, Epochs).
type Scope struct {
	Resources []string
	Kinds     []string
	Epochs    bool
}

// allResources reports whether the scope covers every resource.
func (sc Scope) allResources() bool { return len(sc.Resources) == 0 }

// Resource reports whether the scope covers resource.
func (sc Scope) Resource(resource string) bool {
	if sc.allResources() {
		return true
	}
	for _, p := range sc.Resources {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(resource, prefix) {
				return true
			}
		} else if p == resource {
			return true
		}
	}
	return false
}

// Kind reports whether the scope covers kind.
func (sc Scope) Kind(kind string) bool {
	return len(sc.Kinds) == 0 || slices.Contains(sc.Kinds, kind)
}

func (t Token) validate() error {
	switch {
	case t.Name == "" || len(t.Name) > 200 || strings.ContainsAny(t.Name, ":,\r\n"):
		return fmt.Errorf("admin: token name %q must be 1 to 200 bytes without ':', ',' or newlines", t.Name)
	case t.Role != RoleWorker && t.Role != RoleOperator:
		return fmt.Errorf("admin: token %q: role must be %q or %q, got %q", t.Name, RoleWorker, RoleOperator, t.Role)
	case weakSecret(t.Secret) != "":
		// Names the token and the rule, never the secret.
		return fmt.Errorf("admin: token %q: secret is too easy to guess: it %s (make one with `gateway token new`)", t.Name, weakSecret(t.Secret))
	case strings.ContainsAny(t.Secret, " \t\r\n,"):
		return fmt.Errorf("admin: token %q: secret must not contain whitespace or ','", t.Name)
	case slices.Contains(t.Resources, "") || slices.Contains(t.Kinds, ""):
		return fmt.Errorf("admin: token %q: an empty resource or kind in its scope", t.Name)
	case slices.ContainsFunc(t.Resources, func(p string) bool { return strings.Contains(strings.TrimSuffix(p, "*"), "*") }):
		return fmt.Errorf("admin: token %q: a resource pattern is an exact name or \"prefix*\"", t.Name)
	case t.Principal != "" && !policy.ValidName(t.Principal):
		return fmt.Errorf("admin: token %q: principal must be a principal's name (1 to 64 of a-z, 0-9, '.', '_', '-'), got %q", t.Name, t.Principal)
	}
	return nil
}

// ParseTokens parses tokens in either format: a JSON array of
// {"name","role","token"} objects, or "name:role:token" entries separated by
// newlines or commas (blank lines and lines starting with '#' are ignored).
// The secret is everything after the second ':'.
func ParseTokens(s string) ([]Token, error) {
	trimmed := strings.TrimSpace(s)
	var out []Token
	if strings.HasPrefix(trimmed, "[") {
		dec := json.NewDecoder(strings.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&out); err != nil {
			return nil, fmt.Errorf("admin: tokens: bad JSON: %w", err)
		}
	} else {
		for _, line := range strings.FieldsFunc(trimmed, func(r rune) bool { return r == '\n' || r == ',' }) {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				// Don't echo the line: it may hold a secret.
				return nil, fmt.Errorf("admin: tokens: entry %d is not name:role:token", len(out)+1)
			}
			t := Token{Name: parts[0], Role: Role(parts[1]), Secret: parts[2]}
			if err := t.scopeFields(); err != nil {
				return nil, fmt.Errorf("admin: tokens: entry %d: %w", len(out)+1, err)
			}
			out = append(out, t)
		}
	}
	if err := CheckTokens(out); err != nil {
		return nil, err
	}
	return out, nil
}

// CheckTokens checks tokens as New does, connecting to nothing: each
// token's fields, and no secret configured twice (a request presenting it
// would act as whichever token came last). An error names the token,
// never its secret.
func CheckTokens(tokens []Token) error {
	seen := make(map[string]bool, len(tokens))
	for _, t := range tokens {
		if err := t.validate(); err != nil {
			return err
		}
		if seen[t.Secret] {
			return fmt.Errorf("admin: token %q: the same secret is configured twice", t.Name)
		}
		seen[t.Secret] = true
	}
	return nil
}

// scopeFields moves the optional scope fields of the line format from the
// end of the secret into t: name:role:token[:resources=a;b*][:kinds=email;file][:epochs=true][:principal=P].
func (t *Token) scopeFields() error {
	for {
		i := strings.LastIndexByte(t.Secret, ':')
		if i < 0 {
			return nil
		}
		field := t.Secret[i+1:]
		key, val, ok := strings.Cut(field, "=")
		if !ok || (key != "resources" && key != "kinds" && key != "epochs" && key != "principal") {
			return nil // part of the secret
		}
		switch key {
		case "resources":
			t.Resources = strings.Split(val, ";")
		case "kinds":
			t.Kinds = strings.Split(val, ";")
		case "principal":
			t.Principal = val
		case "epochs":
			b, err := strconv.ParseBool(val)
			if err != nil {
				return fmt.Errorf("epochs must be true or false")
			}
			t.Epochs = b
		}
		t.Secret = t.Secret[:i]
	}
}

// LoadTokensFile reads tokens from a file in either ParseTokens format.
func LoadTokensFile(path string) ([]Token, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("admin: read tokens: %w", err)
	}
	return ParseTokens(string(b))
}

// TokensFromEnv parses $GATEWAY_TOKENS with getenv (os.Getenv when nil);
// none when it is unset.
func TokensFromEnv(getenv func(string) string) ([]Token, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	v := getenv(EnvTokens)
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	return ParseTokens(v)
}

// principal is who made a request.
type principal struct {
	name string
	// acts is the rule set's principal its grants and enqueues are made
	// as (Token.Principal, else the name).
	acts  string
	role  Role
	scope Scope
}

// acting is the principal grants and enqueues are made as.
func (p principal) acting() string { return cmp.Or(p.acts, p.name) }

// anonymous is the principal of every request to a server without tokens
// (which only binds loopback). It may do everything.
const anonymous = "anonymous"

// authenticator finds the token a request presents.
type authenticator struct {
	tokens []hashedToken
	// compare is subtle.ConstantTimeCompare; tests count its calls.
	compare func(a, b []byte) int
}

type hashedToken struct {
	name   string
	acts   string
	role   Role
	scope  Scope
	digest [sha256.Size]byte
}

func newAuthenticator(tokens []Token) *authenticator {
	a := &authenticator{compare: subtle.ConstantTimeCompare}
	for _, t := range tokens {
		a.tokens = append(a.tokens, hashedToken{name: t.Name, acts: cmp.Or(t.Principal, t.Name), role: t.Role, digest: sha256.Sum256([]byte(t.Secret)),
			scope: Scope{Resources: t.Resources, Kinds: t.Kinds, Epochs: t.Epochs}})
	}
	return a
}

// lookup returns the token whose secret is presented, comparing against
// every configured token in constant time. Both sides are hashed first so
// every comparison runs over 32 bytes whatever the lengths (a plain
// ConstantTimeCompare returns early on a length mismatch, leaking the
// secret's length), and the loop never stops at a match, so the time taken
// does not say which token matched or how many were tried.
func (a *authenticator) lookup(presented string) (principal, bool) {
	d := sha256.Sum256([]byte(presented))
	found := -1
	for i := range a.tokens {
		if a.compare(d[:], a.tokens[i].digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return principal{}, false
	}
	return principal{name: a.tokens[found].name, acts: a.tokens[found].acts, role: a.tokens[found].role, scope: a.tokens[found].scope}, true
}

// bearer returns the token of an "Authorization: Bearer …" header.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}
