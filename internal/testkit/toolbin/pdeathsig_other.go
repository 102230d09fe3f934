//go:build !linux

package toolbin

import "os/exec"

// SetPdeathsig does nothing where the platform has no parent-death signal.
func SetPdeathsig(*exec.Cmd) {}
