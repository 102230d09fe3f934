//go:build !linux

package cli

import "os"

// isTerminal reports whether f is a character device: a terminal, or
// /dev/null (which nobody reads, whatever it is given).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
