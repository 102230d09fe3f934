package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strconv"
)

// Fingerprint returns the hex sha256 of kind and the canonical form of
// payload. A JSON payload is canonicalised — decoded and re-encoded with
// object keys sorted and insignificant whitespace dropped — so key order and
// formatting (including PostgreSQL's jsonb re-rendering) don't change the
// fingerprint; numbers are compared by their literal text (1 and 1.0
// differ), and with duplicate object keys the last one counts, as in jsonb.
// A payload that is not one JSON value is hashed as raw bytes, in a separate
// domain, so it never collides with a JSON payload.
func Fingerprint(kind string, payload []byte) string {
	c := getCanonicalizer()
	defer c.release()
	canon, isJSON := c.canonical(payload)
	return fingerprint(kind, payload, canon, isJSON)
}

// fingerprint hashes kind with canon, payload's canonical form, when
// payload is JSON, else with payload itself.
func fingerprint(kind string, payload, canon []byte, isJSON bool) string {
	h := sha256.New()
	// Length-prefix the kind so ("ab", "c…") and ("a", "bc…") differ.
	io.WriteString(h, "fencegate/idempotency/v1\x00")
	io.WriteString(h, strconv.Itoa(len(kind)))
	io.WriteString(h, ":")
	io.WriteString(h, kind)
	if isJSON {
		io.WriteString(h, "\x00json\x00")
		h.Write(canon)
	} else {
		io.WriteString(h, "\x00raw\x00")
		h.Write(payload)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// canonicalJSON, the reference path of the canonical form (canonical.go),
// re-encodes one JSON value with sorted object keys
// (encoding/json sorts map keys) and numbers kept as written (UseNumber).
func canonicalJSON(payload []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data: not a single JSON value
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, false
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), true
}
