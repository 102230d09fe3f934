package failpoint

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// The production build has no failpoints.
func TestOffByDefault(t *testing.T) {
	t.Parallel()
	if Enabled {
		t.Skip("built with -tags failpoints")
	}
	Inject(AfterEffectBeforeRecord) // must do nothing
}

// WaitStopped sees a SIGSTOPped process and ProcState its running again.
func TestWaitStopped(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := WaitStopped(cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := ProcState(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if st != 'T' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still stopped after SIGCONT")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := ProcState(os.Getpid() + 1<<22); err == nil {
		t.Fatal("ProcState of a missing process succeeded")
	}
}
