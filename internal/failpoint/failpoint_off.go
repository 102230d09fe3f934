//go:build !failpoints

package failpoint

// Enabled reports whether failpoints are compiled in (build tag failpoints).
const Enabled = false

// Inject does nothing: this build has no failpoints. It is empty and
// inlined, so a call site costs nothing in the production binary.
func Inject(string) {}
