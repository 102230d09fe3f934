package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/fencegate/fencegate/admin"
)

// tokenBytes is the size of a token `gateway token new` makes: 256 random
// bits, well above the 128 a bearer secret needs.
const tokenBytes = 32

// cmdToken runs `gateway token new [--name N --role R]`: it prints a new
// random token as {"token": "…"} (base64url without padding: no ':' or
// ',', so it fits both tokens formats). With --name and --role it also
// prints the tokens file's line for it ({"name","role","line"}), checked
// as the gateway will check it when it loads the file. Nothing is stored:
// the token is shown once, here.
func cmdToken(ctx context.Context, a *app, args []string) int {
	if code, done := a.groupHelp("token", args); done {
		return code
	}
	if len(args) == 0 || args[0] != "new" {
		return a.fail(badInput("command", "usage: gateway token new [--name NAME --role worker|operator]"))
	}
	fs := flag.NewFlagSet("gateway token new", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("name", "", "the token's name (the actor of its actions), for the tokens file's line")
	role := fs.String("role", "", "the token's role, worker or operator, for the tokens file's line")
	if code, ok := a.parseOnly(fs, args[1:]); !ok {
		return code
	}
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	tok := base64.RawURLEncoding.EncodeToString(b)
	if *name == "" && *role == "" {
		a.writeJSON(map[string]string{"token": tok})
		return exitOK
	}
	switch {
	case *name == "":
		return a.fail(badInput("name", "--role needs --name: the tokens file's line names the token"))
	case *role != string(admin.RoleWorker) && *role != string(admin.RoleOperator):
		return a.fail(badInput("role", fmt.Sprintf("--role must be %s or %s", admin.RoleWorker, admin.RoleOperator)))
	}
	line := *name + ":" + *role + ":" + tok
	// Checked in the JSON format, where the name cannot be mistaken for
	// the other fields.
	entry, _ := json.Marshal([]admin.Token{{Name: *name, Role: admin.Role(*role), Secret: tok}})
	if _, err := admin.ParseTokens(string(entry)); err != nil {
		// The token is new and strong: what is wrong is the name.
		return a.fail(badInput("name", "--name: "+oneLine(err.Error())))
	}
	a.writeJSON(map[string]string{"token": tok, "name": *name, "role": *role, "line": line})
	return exitOK
}
