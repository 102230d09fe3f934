package toolbin

import (
	"path/filepath"
	"testing"
)

// The finder reads `go env GOBIN GOPATH`. With GOBIN unset the
// first line is empty, and go install puts binaries in the first GOPATH
// entry's bin directory.
func TestBinDirFromGoEnv(t *testing.T) {
	t.Parallel()
	list := "/first/go" + string(filepath.ListSeparator) + "/second/go"
	cases := []struct {
		name, out, want string
	}{
		{"GOBIN unset", "\n/root/go\n", "/root/go/bin"},
		{"GOBIN set", "/opt/gobin\n/root/go\n", "/opt/gobin"},
		{"GOPATH list", "\n" + list + "\n", "/first/go/bin"},
		{"CRLF", "\r\n/root/go\r\n", "/root/go/bin"},
	}
	for _, c := range cases {
		got, err := binDirFromGoEnv(c.out)
		if err != nil || got != c.want {
			t.Errorf("%s: binDirFromGoEnv(%q) = %q, %v; want %q", c.name, c.out, got, err, c.want)
		}
	}
	for _, out := range []string{"", "\n", "\n\n", " \n \n"} {
		if got, err := binDirFromGoEnv(out); err == nil {
			t.Errorf("binDirFromGoEnv(%q) = %q, want an error naming GOBIN and GOPATH", out, got)
		}
	}
}
