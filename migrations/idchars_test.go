package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// invisible are characters that display as nothing, or reorder what is
// displayed around them, so that an id reads as another: control (Cc)
// and format (Cf) characters.
var invisible = map[string]string{
	"RLO": "\u202e", "LRI": "\u2066", "ALM": "\u061c", "ZWSP": "\u200b", "ZWJ": "\u200d", "BOM": "\ufeff",
	"SHY": "\u00ad", "TAG": "\U000e0001", "tab": "\t", "LF": "\n", "ESC": "\x1b", "DEL": "\x7f", "NEL": "\u0085",
}

// Resource ids, operation ids, idempotency keys and holders with control
// or format characters are refused, naming the field, by every way in:
// the Go client, the lease issuer, and the SQL interface's enqueue and
// acquire; nothing is stored. Ids of other characters still pass.
func TestIDsRefuseControlAndFormatCharacters(t *testing.T) {
	t.Parallel()
	pool, iss := sqlSetup(t)
	ctx := context.Background()
	ob := coretest.Outbox(t, pool)
	l := acquire(t, iss, "r")
	field := func(err error) string {
		var inv *fenceerr.InvalidError
		if errors.As(err, &inv) {
			return inv.Field
		}
		return ""
	}
	checked := 0
	for name, c := range invisible {
		bad := "a" + c + "b"
		ok := outbox.Intent{Resource: "r", Epoch: l.Epoch, OperationID: "op-" + name, Kind: "email", Payload: json.RawMessage(mail)}
		for f, edit := range map[string]func(in *outbox.Intent){
			"resource":        func(in *outbox.Intent) { in.Resource = bad },
			"operation_id":    func(in *outbox.Intent) { in.OperationID = bad },
			"idempotency_key": func(in *outbox.Intent) { in.IdempotencyKey = bad },
		} {
			in := ok
			edit(&in)
			checked++
			if _, err := ob.Validate(in); field(err) != f {
				t.Errorf("Go client, %s %q: %v; want refused naming %s", f, bad, err, f)
			}
			if _, err := ob.Enqueue(ctx, in); field(err) != f {
				t.Errorf("Go client enqueue, %s %q: %v; want refused naming %s", f, bad, err, f)
			}
			var key *string
			if in.IdempotencyKey != "" {
				key = &in.IdempotencyKey
			}
			_, err := sqlEnqueue(ctx, pool, enqueueArgs{resource: in.Resource, epoch: in.Epoch, operation: in.OperationID,
				kind: in.Kind, payload: string(in.Payload), key: key})
			if err == nil {
				t.Errorf("SQL enqueue, %s %q: accepted", f, bad)
			} else if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != f {
				t.Errorf("SQL enqueue, %s %q: %+v (%v); want ZF004 naming %s", f, bad, e, err, f)
			}
		}
		if err := lease.ValidateResource(bad); field(err) != "resource" {
			t.Errorf("lease.ValidateResource(%q) = %v; want refused naming resource", bad, err)
		}
		for f, args := range map[string][2]string{"resource": {bad, "A"}, "holder": {"r-" + name, bad}} {
			checked++
			if _, err := iss.Acquire(ctx, args[0], args[1], time.Minute); field(err) != f {
				t.Errorf("lease acquire, %s %q: %v; want refused naming %s", f, bad, err, f)
			}
			_, err := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.acquire($1, $2, interval '1 minute')`), args[0], args[1])
			if err == nil {
				t.Errorf("SQL acquire, %s %q: accepted", f, bad)
			} else if e := asSQLErr(t, err); e.Code != "ZF004" || e.Field != f {
				t.Errorf("SQL acquire, %s %q: %+v (%v); want ZF004 naming %s", f, bad, e, err, f)
			} else if cp := fmt.Sprintf("got %U", []rune(c)[0]); !strings.HasSuffix(err.Error(), cp+" (SQLSTATE ZF004)") {
				// The character's code point as Go's %U writes it (5
				// and 6 hex digits above U+FFFF, not cut to 4).
				t.Errorf("SQL acquire, %s %q: %v; want the message to end %q", f, bad, err, cp)
			}
		}
	}
	var intents, resources int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT (SELECT count(*) FROM fencegate.intents), (SELECT count(*) FROM fencegate.resources)`)).
		Scan(&intents, &resources); err != nil || intents != 0 || resources != 1 {
		t.Errorf("after refused ids: %d intents, %d resources (%v); want 0 and 1", intents, resources, err)
	}
	// Other characters, in every field, through Go and SQL.
	for i, id := range []string{"日本/é-1", "a b", "x\u00a0y", "\u05d0\u05d1", "emoji-\U0001f600"} {
		r := id + "-res"
		lr, err := iss.Acquire(ctx, r, id, time.Minute)
		if err != nil {
			t.Fatalf("acquire %q: %v", id, err)
		}
		in := outbox.Intent{Resource: r, Epoch: lr.Epoch, OperationID: id, IdempotencyKey: id + "-go", Kind: "email", Payload: json.RawMessage(mail)}
		if _, err := ob.Enqueue(ctx, in); err != nil {
			t.Errorf("Go enqueue of ids %q: %v", id, err)
		}
		key := id + "-sql"
		if _, err := sqlEnqueue(ctx, pool, enqueueArgs{resource: r, epoch: lr.Epoch, operation: id + "-" + string(rune('a'+i)),
			kind: "email", payload: mail, key: &key}); err != nil {
			t.Errorf("SQL enqueue of ids %q: %v", id, err)
		}
	}
	t.Logf("%d refusals checked in each of Go and SQL over %d characters", checked, len(invisible))
}

// Per character, SQL refuses in an id (fencegate_check_id) and in a file
// target (fencegate_check_payload) exactly what Go refuses (outbox's
// check of a resource id, the file kind's check of a target): every
// control and format character of Go's Unicode tables and their
// neighbours, and a random sample of the rest.
func TestSQLRefusesTheCharactersGoRefuses(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ob := coretest.Outbox(t, pool)
	seen := map[rune]bool{}
	var cps []int32
	add := func(r rune) {
		if r > 0 && r <= unicode.MaxRune && utf8.ValidRune(r) && !seen[r] {
			seen[r] = true
			cps = append(cps, r)
		}
	}
	for _, tab := range []*unicode.RangeTable{unicode.Cc, unicode.Cf} {
		for _, rg := range tab.R16 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				add(r - 1)
				add(r)
				add(r + 1)
			}
		}
		for _, rg := range tab.R32 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				add(r - 1)
				add(r)
				add(r + 1)
			}
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("sample seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 29))
	for range 3000 {
		add(rng.Int32N(unicode.MaxRune + 1))
	}
	slices.Sort(cps)

	var goIDs, goTargets []int32
	fileCheck := outbox.DefaultKinds()["file"].Check
	for _, r := range cps {
		s := "a" + string(r) + "b"
		if _, err := ob.Validate(outbox.Intent{Resource: s, Epoch: 1, OperationID: "o", Kind: "email", Payload: json.RawMessage(mail)}); err != nil {
			goIDs = append(goIDs, r)
		}
		raw, _ := json.Marshal(map[string]string{"target": s, "content": "x"})
		if err := fileCheck(raw); err != nil {
			goTargets = append(goTargets, r)
		}
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, testdb.SQL(`CREATE FUNCTION pg_temp.refused(cps int[], OUT ids int[], OUT targets int[])
LANGUAGE plpgsql AS $$
DECLARE
    c int;
BEGIN
    ids := '{}';
    targets := '{}';
    FOREACH c IN ARRAY cps LOOP
        BEGIN
            PERFORM fencegate.fencegate_check_id('resource', 'a' || chr(c) || 'b', 200);
        EXCEPTION WHEN SQLSTATE 'ZF004' THEN
            ids := ids || c;
        END;
        BEGIN
            PERFORM fencegate.fencegate_check_payload('file', jsonb_build_object('target', 'a' || chr(c) || 'b', 'content', 'x'));
        EXCEPTION WHEN SQLSTATE 'ZF004' THEN
            targets := targets || c;
        END;
    END LOOP;
END
$$`)); err != nil {
		t.Fatal(err)
	}
	var sqlIDs, sqlTargets []int32
	if err := conn.QueryRow(ctx, `SELECT ids, targets FROM pg_temp.refused($1)`, cps).Scan(&sqlIDs, &sqlTargets); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what    string
		go_, sq []int32
	}{{"an id", goIDs, sqlIDs}, {"a file target", goTargets, sqlTargets}} {
		if len(c.go_) == 0 {
			t.Errorf("Go refuses no character in %s: nothing compared", c.what)
		}
		if !slices.Equal(c.go_, c.sq) {
			t.Errorf("in %s, Go refuses %d characters, SQL %d; only Go: %U; only SQL: %U", c.what, len(c.go_), len(c.sq),
				minus(c.go_, c.sq), minus(c.sq, c.go_))
		}
	}
	t.Logf("%d characters tried; refused in an id: %d by Go, %d by SQL; in a target: %d by Go, %d by SQL",
		len(cps), len(goIDs), len(sqlIDs), len(goTargets), len(sqlTargets))
}

func minus(a, b []int32) []rune {
	var out []rune
	for _, r := range a {
		if !slices.Contains(b, r) {
			out = append(out, r)
		}
	}
	return out
}

// A refused character is named as Go names it (%U: U+ and at least four
// hex digits), also above U+FFFF: the SQL interface's message for a file
// target is the file kind's.
func TestSQLNamesTheRefusedCharacterAsGo(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	fileCheck := outbox.DefaultKinds()["file"].Check
	cps := []rune{'\t', 0x7f, 0xad, 0x202e, 0xfeff, 0x110bd, 0x1d173, 0xe0001, 0xe0041, 0xe007f}
	for _, c := range invisible {
		r, _ := utf8.DecodeRuneInString(c)
		cps = append(cps, r)
	}
	checked := 0
	for _, r := range cps {
		raw, _ := json.Marshal(map[string]string{"target": "a" + string(r) + "b", "content": "x"})
		goErr := fileCheck(raw)
		if goErr == nil {
			t.Errorf("Go accepts the target with %U", r)
			continue
		}
		_, err := pool.Exec(ctx, testdb.SQL(`SELECT fencegate.fencegate_check_payload('file', $1::jsonb)`), string(raw))
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			t.Errorf("SQL check of the target with %U: %v; want ZF004", r, err)
			continue
		}
		checked++
		if pe.Code != "ZF004" || pe.Message != goErr.Error() {
			t.Errorf("SQL refuses the target with %U: %s %q; want ZF004 %q", r, pe.Code, pe.Message, goErr.Error())
		}
	}
	t.Logf("%d characters' messages compared", checked)
	if checked == 0 {
		t.Fatal("no message compared")
	}
}
