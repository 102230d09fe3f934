// Package toolbin finds the binaries of the servers the tests start from
// nothing (Mailpit, versitygw): from an environment variable, $PATH, or
// where `go install` puts them, building them with go install when
// missing.
package toolbin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Find returns the path of the binary name: $env when set (it must be an
// executable file), else name on $PATH, else $(go env GOBIN) or the first
// $(go env GOPATH) entry's bin; when none exists it runs
//
//	GOFLAGS=-mod=mod go install module
//
// outside any module (so the install cannot touch a go.mod).
func Find(env, name, module string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if IsExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("%s=%q is not an executable file", env, p)
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	binDir, err := GoBinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(binDir, name)
	if IsExecutable(p) {
		return p, nil
	}
	cmd := exec.Command("go", "install", module)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s (go install %s): %w\n%s", name, module, err, out)
	}
	if !IsExecutable(p) {
		return "", fmt.Errorf("go install %s succeeded but %s is missing", module, p)
	}
	return p, nil
}

// GoBinDir returns where `go install` puts binaries.
func GoBinDir() (string, error) {
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOBIN GOPATH: %w", err)
	}
	return binDirFromGoEnv(string(out))
}

// binDirFromGoEnv returns where `go install` puts binaries, from the output
// of `go env GOBIN GOPATH`: one line per variable, GOBIN first.
func binDirFromGoEnv(out string) (string, error) {
	// Split before trimming: with GOBIN unset the first line is empty, and
	// trimming the whole output first would shift GOPATH into GOBIN's place.
	lines := strings.Split(out, "\n")
	if gobin := strings.TrimSpace(lines[0]); gobin != "" {
		return gobin, nil
	}
	if len(lines) < 2 || strings.TrimSpace(lines[1]) == "" {
		return "", errors.New("go env: neither GOBIN nor GOPATH is set")
	}
	// GOPATH may be a list; go install uses the first entry.
	gopath := filepath.SplitList(strings.TrimSpace(lines[1]))[0]
	return filepath.Join(gopath, "bin"), nil
}

// IsExecutable reports whether p is an executable regular file.
func IsExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
