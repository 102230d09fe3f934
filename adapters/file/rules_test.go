package file

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/filekind"
	"github.com/fencegate/fencegate/outbox"
)

// The file kind has one set of payload rules (filekind): the outbox's
// check at enqueue and the adapter's at execute refuse the same payloads,
// naming the same field; at execute the refusal is permanent, a target
// that would leave the root is ErrOutsideRoot, and nothing is written.
func TestEnqueueAndExecuteShareOneRuleSet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	check := outbox.DefaultKinds()[filekind.Name].Check
	checked := 0
	for _, tc := range []struct {
		payload, field string
		outside        bool
	}{
		{`{"content":"x"}`, "payload.target", false},
		{`{"target":7,"content":"x"}`, "payload.target", false},
		{`{"target":"/etc/passwd","content":"x"}`, "payload.target", true},
		{`{"target":"a/../../etc/passwd","content":"x"}`, "payload.target", true},
		{`{"target":"dir/","content":"x"}`, "payload.target", false},
		// The adapter's own files, in any case: on a case-insensitive file
		// system this is another target's manifest.
		{`{"target":"reports/.nightly.txt.fencegate.json","content":"x"}`, "payload.target", false},
		{`{"target":"reports/.Nightly.txt.FENCEGATE.json","content":"x"}`, "payload.target", false},
		// Characters that display as nothing, or reorder what is around
		// them (U+202E shows "txt.exe" as "exe.txt"), so that a target
		// reads as another: control (Cc) and format (Cf) characters.
		{`{"target":"reports/\u202etxt.exe","content":"x"}`, "payload.target", false},
		{`{"target":"reports/a\u200bb.txt","content":"x"}`, "payload.target", false},
		{`{"target":"\ufeffx","content":"x"}`, "payload.target", false},
		{`{"target":"a\tb","content":"x"}`, "payload.target", false},
		{`{"target":"a\u0085b","content":"x"}`, "payload.target", false},
		{`{"target":"a\u007fb","content":"x"}`, "payload.target", false},
		{`{"target":"tag\udb40\udc01x","content":"x"}`, "payload.target", false},
		// A segment a command line would take for an option.
		{`{"target":"-rf","content":"x"}`, "payload.target", false},
		{`{"target":"reports/-n.txt","content":"x"}`, "payload.target", false},
		{`{"target":"x"}`, "payload.content", false},
		{`{"target":"x","content":null}`, "payload.content", false},
		{`{"target":"x","content":"a","content_base64":"YQ=="}`, "payload.content", false},
		{`{"target":"x","content":5}`, "payload.content", false},
		{`{"target":"x","content_base64":"!!!"}`, "payload.content_base64", false},
		{`"x"`, "payload", false},
		// Only the payload's own fields, spelt exactly (encoding/json
		// matches names without case; the payload's rules do not).
		{`{"target":"x","content":"a","extra":1}`, "payload.extra", false},
		{`{"Target":"x","content":"a"}`, "payload.Target", false},
		{`{"target":"x","Content":"a"}`, "payload.Content", false},
		{`{"target":"x","contentBase64":"YQ=="}`, "payload.contentBase64", false},
		{`{"target":"x","content":"a","mode":null}`, "payload.mode", false},
		{`{"target":"../x","content":"a","extra":1}`, "payload.extra", false},
		// Names a file system refuses (255 bytes), the file's own shorter
		// by the adapter's side files (.<name>.fencegate.staged).
		{`{"target":"` + strings.Repeat("d", 256) + `/x","content":"a"}`, "payload.target", false},
		{`{"target":"` + strings.Repeat("n", filekind.MaxFileName+1) + `","content":"a"}`, "payload.target", false},
		{`{"target":"d/` + strings.Repeat("é", 119) + `","content":"a"}`, "payload.target", false},
	} {
		checked++
		enqErr := check(json.RawMessage(tc.payload))
		var inv *fenceerr.InvalidError
		if !errors.As(enqErr, &inv) || inv.Field != tc.field {
			t.Errorf("enqueue check of %s = %v, want an InvalidError naming %s", tc.payload, enqErr, tc.field)
			continue
		}
		req := adapters.Request{IntentID: 1, Epoch: 1, IdempotencyKey: "k", Fence: outbox.FenceExecute, Payload: json.RawMessage(tc.payload)}
		_, exErr := b.a.Execute(context.Background(), req)
		want := ErrBadPayload
		if tc.outside {
			want = ErrOutsideRoot
		}
		if !adapters.IsPermanent(exErr) || !errors.Is(exErr, want) || !strings.Contains(exErr.Error(), enqErr.Error()) {
			t.Errorf("execute of %s = %v, want permanent, %v, and the enqueue's error %q", tc.payload, exErr, want, enqErr)
		}
	}
	t.Logf("%d bad payloads checked at enqueue and execute", checked)
	if checked == 0 {
		t.Fatal("no payload checked")
	}
	if n := b.writes.Load(); n != 0 {
		t.Errorf("%d content writes for refused payloads, want 0", n)
	}
	if ents, _ := os.ReadDir(b.root); len(ents) != 0 {
		t.Errorf("the root holds %d entries after refused payloads, want none", len(ents))
	}
}

// Data returns the content, text or base64.
func TestTypedPayloadData(t *testing.T) {
	t.Parallel()
	checked := 0
	for raw, want := range map[string]string{
		`{"target":"a/b.txt","content":"hello"}`:                   "hello",
		`{"target":"a/b.txt","content_base64":"aGk="}`:             "hi",
		`{"target":"a/b.txt","content":""}`:                        "",
		`{"target":"a/b.txt","content":"x","content_base64":null}`: "x",
	} {
		checked++
		p, err := filekind.Parse(json.RawMessage(raw))
		if err != nil || string(p.Data()) != want {
			t.Errorf("Parse(%s) = %q, %v; want %q", raw, p.Data(), err, want)
		}
	}
	t.Logf("%d payloads checked", checked)
	if checked == 0 {
		t.Fatal("no payload checked")
	}
}

// The longest names the file kind accepts publish: a directory name of 255
// bytes and a file name of filekind.MaxFileName, whose side files
// (.<name>.fencegate.staged, .lock, .json, .json.tmp) are at most 255
// bytes.
func TestLongestNamesPublish(t *testing.T) {
	t.Parallel()
	longest := max(len(stagedSuffix), len(lockSuffix), len(manifestSuffix+tmpSuffix))
	if n := len(".") + filekind.MaxFileName + longest; n != filekind.MaxName {
		t.Fatalf("the longest side file of a %d-byte name is %d bytes; want filekind.MaxFileName to make it %d", filekind.MaxFileName, n, filekind.MaxName)
	}
	b := setup(t)
	target := strings.Repeat("d", 255) + "/" + strings.Repeat("n", filekind.MaxFileName)
	payload, _ := json.Marshal(map[string]string{"target": target, "content": "x"})
	if err := outbox.DefaultKinds()[filekind.Name].Check(payload); err != nil {
		t.Fatalf("enqueue check: %v", err)
	}
	req := adapters.Request{IntentID: 1, Epoch: 1, IdempotencyKey: "k-long", Fence: outbox.FenceExecute, Payload: payload}
	if _, err := b.a.Execute(context.Background(), req); err != nil {
		t.Fatalf("execute of a %d-byte file name in a 255-byte directory: %v", filekind.MaxFileName, err)
	}
	if got, err := os.ReadFile(b.root + "/" + target); err != nil || string(got) != "x" {
		t.Fatalf("published file: %q, %v", got, err)
	}
}
