// Package s3kind is the s3 kind's payload: its typed form and its one set
// of rules, used by the outbox when an intent is enqueued
// (outbox.DefaultKinds) and by the s3 adapter when it is executed.
//
// It is a leaf package (it imports neither outbox nor adapters), so that
// the outbox can register the kind without importing the adapter.
package s3kind

import (
	"encoding/json"
	"errors"
	"path"
	"strings"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/kindcheck"
	"github.com/fencegate/fencegate/kinds/filekind"
)

// Name is the kind's name.
const Name = "s3"

// MaxMetadataBytes bounds the user metadata's names and values together
// (S3 allows 2 KiB of user metadata; the adapter adds its own fields).
const MaxMetadataBytes = 1024

// ReservedDir is the first segment of every key the adapter keeps for
// itself in a bucket (its receipts and probes, ReservedDir + "/…"): no
// payload may name a key under it (ReservedKey).
const ReservedDir = ".fencegate"

// Payload is an s3 intent's payload: an object to publish.
type Payload struct {
	// Bucket is the bucket; empty: the adapter's default (--s3-bucket).
	Bucket string `json:"bucket,omitempty"`
	// Key is the object key: a clean relative path, as the file kind's
	// target (no leading "/", no "..", "." or empty segments), not under
	// .fencegate/ (ReservedKey).
	Key string `json:"key"`
	// Content (text) or ContentBase64 (bytes): exactly one.
	Content       *string `json:"content,omitempty"`
	ContentBase64 *string `json:"content_base64,omitempty"`
	// ContentType of the object. Default: application/octet-stream.
	ContentType string `json:"content_type,omitempty"`
	// Metadata is user metadata (x-amz-meta-*): lower-case names of
	// letters, digits and '-', not starting with "fencegate-" (the
	// adapter's own).
	Metadata map[string]string `json:"metadata,omitempty"`
}

var fields = []string{"bucket", "key", "content", "content_base64", "content_type", "metadata"}

// Parse decodes raw and validates it. Every error is a
// *fenceerr.InvalidError naming the field. On an error, the Payload holds
// what was decoded before it.
func Parse(raw json.RawMessage) (Payload, error) {
	var p Payload
	obj, err := kindcheck.Fields(raw, "an s3", fields)
	if err != nil {
		return p, err
	}
	if err := kindcheck.ReadStrings(obj, kindcheck.Field{Name: "bucket", Dst: &p.Bucket}, kindcheck.Field{Name: "key", Dst: &p.Key},
		kindcheck.Field{Name: "content_type", Dst: &p.ContentType}); err != nil {
		return p, err
	}
	if err := kindcheck.ReadOptional(obj, kindcheck.OptionalField{Name: "content", Dst: &p.Content},
		kindcheck.OptionalField{Name: "content_base64", Dst: &p.ContentBase64}); err != nil {
		return p, err
	}
	if p.Metadata, err = kindcheck.StringMap(obj, "metadata"); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// Validate checks p: a valid bucket name when given, a clean key, exactly
// one content, valid metadata.
func (p Payload) Validate() error {
	if p.Bucket != "" {
		if err := CheckBucket("payload.bucket", p.Bucket); err != nil {
			return err
		}
	}
	if err := filekind.ValidateTarget(p.Key); err != nil {
		var inv *fenceerr.InvalidError
		if errors.As(err, &inv) {
			return fenceerr.Invalid("payload.key", "%s", inv.Message)
		}
		return err
	}
	if ReservedKey(p.Key) {
		return fenceerr.Invalid("payload.key", "%q is under %s/, reserved for the adapter's receipts and probes (compared after percent-decoding, without case)", p.Key, ReservedDir)
	}
	if len(p.Key) > 1024 {
		return fenceerr.Invalid("payload.key", "must be at most 1024 bytes, got %d", len(p.Key))
	}
	if err := kindcheck.Content(p.Content, p.ContentBase64); err != nil {
		return err
	}
	if strings.ContainsAny(p.ContentType, "\r\n\x00") {
		return fenceerr.Invalid("payload.content_type", "must not contain CR, LF or NUL")
	}
	size := 0
	for k, v := range p.Metadata {
		field := "payload.metadata." + k
		switch {
		case k == "" || strings.Trim(k, "abcdefghijklmnopqrstuvwxyz0123456789-") != "":
			return fenceerr.Invalid(field, "must be a lower-case name of letters, digits and '-'")
		case strings.HasPrefix(k, "fencegate-"):
			return fenceerr.Invalid(field, "is the adapter's own (fencegate-*) and cannot be set")
		case strings.ContainsAny(v, "\r\n\x00"):
			return fenceerr.Invalid(field, "must not contain CR, LF or NUL")
		}
		size += len(k) + len(v)
	}
	if size > MaxMetadataBytes {
		return fenceerr.Invalid("payload.metadata", "is %d bytes, over the limit of %d", size, MaxMetadataBytes)
	}
	return nil
}

// ReservedKey reports whether key names an object under ReservedDir/ (or
// ReservedDir itself, which would stand where the directory is on a
// file-backed server) once every trick that a server, a proxy or a
// file-backed store might undo is undone: percent-escapes (decoded
// leniently, an invalid one left as is, up to four levels deep), '\' as
// '/', ".", ".." and empty segments, trailing dots and spaces of the
// segment (dropped by some file systems), and case (a case-insensitive
// backend). S3 itself treats a key as opaque bytes; refusing more than it
// would is the safe side.
func ReservedKey(key string) bool {
	k := key
	for range 4 {
		d := unescapeLenient(k)
		if d == k {
			break
		}
		k = d
	}
	k = path.Clean("/" + strings.ReplaceAll(k, `\`, "/"))
	first, _, _ := strings.Cut(strings.TrimPrefix(k, "/"), "/")
	return strings.EqualFold(strings.TrimRight(first, ". "), ReservedDir)
}

// unescapeLenient decodes every valid %XX escape of s and leaves anything
// else as it is (url.PathUnescape refuses the whole string on one bad
// escape, which would hide the others).
func unescapeLenient(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// CheckBucket checks an S3 bucket name (3-63 characters: lower-case
// letters, digits, '.', '-'; starting and ending with a letter or digit).
func CheckBucket(field, b string) error {
	if len(b) < 3 || len(b) > 63 || strings.Trim(b, "abcdefghijklmnopqrstuvwxyz0123456789.-") != "" ||
		strings.ContainsAny(b[:1]+b[len(b)-1:], ".-") {
		return fenceerr.Invalid(field, "%q is not a valid bucket name (3-63 of a-z, 0-9, '.', '-')", b)
	}
	return nil
}

// Data returns the content to publish. p must be valid (Validate).
func (p Payload) Data() []byte { return kindcheck.Bytes(p.Content, p.ContentBase64) }
