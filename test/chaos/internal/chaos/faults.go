package chaos

import "sync"

// faults are the faults a destination is armed with (Arm) and those it
// applied (Injected).
type faults struct {
	mu       sync.Mutex
	armed    map[string]int // fault -> requests it still applies to
	injected map[string]int
}

func newFaults() *faults {
	return &faults{armed: map[string]int{}, injected: map[string]int{}}
}

// Arm makes the next n requests that fault applies to misbehave so.
func (fs *faults) Arm(fault string, n int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.armed[fault] += n
}

// Disarm drops the faults not yet applied.
func (fs *faults) Disarm() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	clear(fs.armed)
}

// Injected returns how often each fault was applied.
func (fs *faults) Injected() map[string]int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return copyCounts(fs.injected)
}

// take applies the first of kinds, in their order, that is armed and that
// applies to the request (applies nil: every one), and returns it ("":
// none).
func (fs *faults) take(kinds []string, applies func(fault string) bool) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range kinds {
		if fs.armed[f] == 0 || (applies != nil && !applies(f)) {
			continue
		}
		fs.armed[f]--
		fs.injected[f]++
		return f
	}
	return ""
}
