// Package filekind is the file kind's payload: its typed form and its one
// set of rules, used by the outbox when an intent is enqueued
// (outbox.DefaultKinds) and by the file adapter when it is executed.
//
// It is a leaf package (it imports neither outbox nor adapters), so that
// the outbox can register the kind without importing the adapter.
package filekind

import (
	"encoding/json"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/kindcheck"
)

// Name is the kind's name.
const Name = "file"

// Payload is a file intent's payload: the target path, relative to the
// adapter's root, and its content, given as exactly one of Content (text)
// or ContentBase64 (bytes, standard base64).
type Payload struct {
	Target        string  `json:"target"`
	Content       *string `json:"content,omitempty"`
	ContentBase64 *string `json:"content_base64,omitempty"`
}

// fields are the payload's fields, spelt exactly: no other is accepted.
var fields = []string{"target", "content", "content_base64"}

// Parse decodes raw and validates it. Every error is a
// *fenceerr.InvalidError naming the field ("payload.target"); a field
// that is not one of the payload's, spelt exactly ("Target", "mode"), is
// refused naming it. On an error, the Payload holds what was decoded
// before it.
func Parse(raw json.RawMessage) (Payload, error) {
	var p Payload
	obj, err := kindcheck.Fields(raw, "a file", fields)
	if err != nil {
		return p, err
	}
	if err := kindcheck.ReadStrings(obj, kindcheck.Field{Name: "target", Dst: &p.Target}); err != nil {
		return p, err
	}
	if err := kindcheck.ReadOptional(obj, kindcheck.OptionalField{Name: "content", Dst: &p.Content},
		kindcheck.OptionalField{Name: "content_base64", Dst: &p.ContentBase64}); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// MaxName is the most bytes a file system takes in one name (NAME_MAX);
// MaxFileName the most a target's file name may have: the adapter keeps
// files beside it (.<name>.fencegate.staged, .lock, .json, and
// .<name>.fencegate.json.tmp while it writes the manifest, the longest),
// and those must fit MaxName too.
const (
	MaxName     = 255
	MaxFileName = MaxName - len(".") - len(".fencegate.json.tmp")
)

// Validate checks p: a valid Target (ValidateTarget) whose names a file
// system takes (ValidateNameLengths), and exactly one of Content and
// ContentBase64, the latter valid base64.
func (p Payload) Validate() error {
	if err := ValidateTarget(p.Target); err != nil {
		return err
	}
	if err := ValidateNameLengths(p.Target); err != nil {
		return err
	}
	if err := kindcheck.Content(p.Content, p.ContentBase64); err != nil {
		return err
	}
	return nil
}

// Data returns the content to publish. p must be valid (Validate).
func (p Payload) Data() []byte { return kindcheck.Bytes(p.Content, p.ContentBase64) }

// ValidateTarget checks a file target: a clean relative path, with no ".."
// segment, so that it stays inside the adapter's root; no control or
// format character (kindcheck.Invisible), so that it reads as what it is;
// and no segment starting with "-", which a command line handed the path
// (a cleanup script's "rm $f", say) would take for an option. The error
// is a *fenceerr.InvalidError naming "payload.target".
func ValidateTarget(target string) error {
	bad := func(format string, args ...any) error {
		return fenceerr.Invalid("payload.target", format, args...)
	}
	switch {
	case target == "":
		return bad("is required")
	case strings.ContainsRune(target, 0):
		return bad("must not contain NUL")
	case strings.HasPrefix(target, "/") || strings.HasPrefix(target, `\`):
		return bad("must be relative, got absolute path %q", target)
	case !utf8.ValidString(target):
		return bad("must be valid UTF-8")
	}
	if r, ok := kindcheck.Invisible(target); ok {
		return bad("must not contain control or format characters, got %U", r)
	}
	switch {
	case slices.Contains(strings.Split(target, "/"), ".."):
		return bad("must not contain a \"..\" segment: %q", target)
	case path.Clean(target) != target || target == ".":
		return bad("must be a clean relative file path (no empty or \".\" segments, no trailing slash): %q", target)
	}
	for _, seg := range strings.Split(target, "/") {
		if strings.HasPrefix(seg, "-") {
			return bad("segment %q starts with \"-\", which a command line would take for an option", seg)
		}
		if Reserved(seg) {
			return bad("segment %q is reserved for the adapter's own files (.<name>.fencegate.*, in any case)", seg)
		}
	}
	return nil
}

// ValidateNameLengths checks that a file system takes target's names: each
// directory name at most MaxName bytes, the file name at most MaxFileName.
// Not part of ValidateTarget: an s3 key, checked with ValidateTarget too,
// has no such limit. Checked at enqueue, so that a target no publication
// can write is refused naming payload.target, not failed at execute.
func ValidateNameLengths(target string) error {
	segs := strings.Split(target, "/")
	for i, seg := range segs {
		switch {
		case i < len(segs)-1 && len(seg) > MaxName:
			return fenceerr.Invalid("payload.target", "directory name %d is %d bytes; a file system takes at most %d", i+1, len(seg), MaxName)
		case i == len(segs)-1 && len(seg) > MaxFileName:
			return fenceerr.Invalid("payload.target", "the file name is %d bytes; at most %d (the adapter keeps .<name>.fencegate.json.tmp beside it, and a file system takes %d)", len(seg), MaxFileName, MaxName)
		}
	}
	return nil
}

// Reserved reports whether a path segment names one of the file
// adapter's own files (.<name>.fencegate.manifest, .staged, …): a dotfile
// containing ".fencegate.", compared without case, since on a
// case-insensitive file system ".X.FENCEGATE.manifest" is the same file as
// ".x.fencegate.manifest" — another target's manifest.
func Reserved(seg string) bool {
	return strings.HasPrefix(seg, ".") && strings.Contains(strings.ToLower(seg), ".fencegate.")
}

// Escapes reports whether target would leave the root: an absolute path
// or one with a ".." segment (ValidateTarget refuses both).
func Escapes(target string) bool {
	return strings.HasPrefix(target, "/") || strings.HasPrefix(target, `\`) || slices.Contains(strings.Split(target, "/"), "..")
}
