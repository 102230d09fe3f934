package toolbin

import (
	"os/exec"
	"syscall"
)

// SetPdeathsig kills the server if the test process dies without cleaning up.
func SetPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
