package failpoint

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// ProcState returns the state letter of process pid from /proc/PID/stat
// (R running, S sleeping, T stopped, Z zombie, …), or an error when the
// process does not exist. Linux only.
func ProcState(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may itself contain spaces and
	// parentheses: the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("failpoint: unexpected /proc/%d/stat: %q", pid, b)
	}
	return b[i+2], nil
}

// WaitStopped polls until process pid is stopped (state T, as after a
// pause failpoint or SIGSTOP) or timeout passes. It fails early when the
// process is gone or a zombie.
func WaitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, err := ProcState(pid)
		switch {
		case err != nil:
			return fmt.Errorf("failpoint: process %d: %w", pid, err)
		case st == 'T' || st == 't':
			return nil
		case st == 'Z' || st == 'X':
			return fmt.Errorf("failpoint: process %d exited instead of pausing", pid)
		case time.Now().After(deadline):
			return fmt.Errorf("failpoint: process %d not stopped after %s (state %c)", pid, timeout, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
