//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Enabled reports whether failpoints are compiled in (build tag failpoints).
const Enabled = true

type action struct {
	kind  string // pause, crash, sleep
	sleep time.Duration
	// left counts the hits that still fire; negative: unlimited.
	left atomic.Int64
}

var (
	once    sync.Once
	armed   map[string]*action
	loadErr error
)

func load() {
	armed, loadErr = parse(os.Getenv(EnvVar))
	if loadErr != nil {
		// A mistyped failpoint would silently test nothing: refuse to run.
		fmt.Fprintf(os.Stderr, "failpoint: %s: %v\n", EnvVar, loadErr)
		os.Exit(2)
	}
}

// parse parses a GATEWAY_FAILPOINTS value: name=action pairs separated by
// commas, where action is pause, crash or sleep(DURATION), optionally
// prefixed by a hit count N*.
func parse(spec string) (map[string]*action, error) {
	m := map[string]*action{}
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, act, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want name=action", item)
		}
		a := &action{}
		a.left.Store(-1)
		if n, rest, ok := strings.Cut(act, "*"); ok {
			c, err := strconv.ParseInt(n, 10, 64)
			if err != nil || c < 1 {
				return nil, fmt.Errorf("%q: bad count %q", item, n)
			}
			a.left.Store(c)
			act = rest
		}
		switch {
		case act == "pause", act == "crash":
			a.kind = act
		case strings.HasPrefix(act, "sleep(") && strings.HasSuffix(act, ")"):
			d, err := time.ParseDuration(act[len("sleep(") : len(act)-1])
			if err != nil {
				return nil, fmt.Errorf("%q: %v", item, err)
			}
			a.kind, a.sleep = "sleep", d
		default:
			return nil, fmt.Errorf("%q: unknown action %q (want pause, crash or sleep(D))", item, act)
		}
		m[strings.TrimSpace(name)] = a
	}
	return m, nil
}

// Inject runs the action armed for the named failpoint, if any: pause
// stops the process with SIGSTOP (it continues on SIGCONT), crash kills it
// with SIGKILL, sleep(D) blocks the calling goroutine for D.
func Inject(name string) {
	once.Do(load)
	a := armed[name]
	if a == nil {
		return
	}
	if a.left.Load() >= 0 && a.left.Add(-1) < 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint: %s: %s pid=%d\n", name, a.kind, os.Getpid())
	switch a.kind {
	case "pause":
		// Stopped until the test releases it (EnvReleaseDir): a SIGCONT
		// from anyone else stops it again. Once, under a loaded full
		// suite, a paused process was continued by a SIGCONT the test
		// never sent (cause not found) and ran to its end before the test
		// saw it stopped.
		dir := os.Getenv(EnvReleaseDir)
		for {
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			if dir == "" {
				return
			}
			if _, err := os.Stat(ReleaseFile(dir, os.Getpid())); err == nil {
				return
			}
			fmt.Fprintf(os.Stderr, "failpoint: %s: continued without a release: pause again pid=%d\n", name, os.Getpid())
		}
	case "crash":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never reached: SIGKILL cannot be caught
	case "sleep":
		time.Sleep(a.sleep)
	}
}
