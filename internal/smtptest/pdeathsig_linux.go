package smtptest

import (
	"os/exec"
	"syscall"
)

// setPdeathsig kills Mailpit if the test process dies without cleaning up.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
