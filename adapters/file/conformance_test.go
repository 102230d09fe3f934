package file_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func newAdapter(t testing.TB, cfg file.Config) *file.Adapter {
	t.Helper()
	a, err := file.New(cfg)
	if err != nil {
		t.Fatalf("file.New: %v", err)
	}
	return a
}

func targetOf(t testing.TB, payload json.RawMessage) string {
	t.Helper()
	var p struct {
		Target string `json:"target"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		t.Fatalf("payload %s: %v", payload, err)
	}
	return p.Target
}

// publications counts the publications of key recorded for target: the
// current one (if its content is in place) and the history.
func publications(t testing.TB, a *file.Adapter, target, key string) int {
	t.Helper()
	m, ok, err := a.Published(target)
	if err != nil {
		t.Fatalf("Published(%q): %v", target, err)
	}
	if !ok {
		return 0
	}
	n := 0
	if m.State == file.StatePublished && m.IdempotencyKey == key {
		n++
	}
	for _, p := range m.History {
		if p.IdempotencyKey == key {
			n++
		}
	}
	return n
}

// TestConformance runs the adapter conformance suite with a fresh root per
// test.
func TestConformance(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	byTest := map[*testing.T]*file.Adapter{}
	adaptertest.Run(t, adaptertest.Harness{
		New: func(t *testing.T) adapters.Executor {
			a := newAdapter(t, file.Config{Root: t.TempDir()})
			mu.Lock()
			byTest[t] = a
			mu.Unlock()
			return a
		},
		Payload: func(i int) json.RawMessage {
			b, _ := json.Marshal(map[string]string{
				"target":  fmt.Sprintf("reports/%d.txt", i),
				"content": fmt.Sprintf("report %d\n", i),
			})
			return b
		},
		Effects: func(t *testing.T, req adapters.Request) int {
			mu.Lock()
			a := byTest[t]
			mu.Unlock()
			return publications(t, a, targetOf(t, req.Payload), req.IdempotencyKey)
		},
		HasLookup: true,
	})
}
