//go:build !linux

package smtptest

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
