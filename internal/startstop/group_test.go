package startstop

import (
	"slices"
	"testing"
	"time"
)

// TestGroup: parts stop in the reverse of their start order; the first
// watched part that stops on its own closes Died and is the Cause; a part
// stopped by StopAll is not a death; a part added after StopAll is stopped
// at once.
func TestGroup(t *testing.T) {
	t.Parallel()
	var g Group
	var order []string
	done := map[string]chan struct{}{}
	for _, name := range []string{"nats", "dispatcher", "adapters"} {
		ch := make(chan struct{})
		done[name] = ch
		g.Add(name, func() {
			order = append(order, name)
			select {
			case <-ch:
			default:
				close(ch)
			}
		}, ch)
	}
	if got := g.Names(); !slices.Equal(got, []string{"nats", "dispatcher", "adapters"}) {
		t.Fatalf("Names = %v", got)
	}
	// The dispatcher dies on its own.
	close(done["dispatcher"])
	select {
	case <-g.Died():
	case <-time.After(10 * time.Second):
		t.Fatal("Died not closed after a part stopped on its own")
	}
	if g.Cause() != "dispatcher" {
		t.Fatalf("Cause = %q, want dispatcher", g.Cause())
	}
	g.StopAll()
	g.StopAll()
	if want := []string{"adapters", "dispatcher", "nats"}; !slices.Equal(order, want) {
		t.Fatalf("stopped in order %v, want %v", order, want)
	}
	late := false
	g.Add("late", func() { late = true }, nil)
	if !late {
		t.Fatal("a part added after StopAll was left running")
	}
	if g.Cause() != "dispatcher" {
		t.Fatalf("Cause after StopAll = %q, want dispatcher", g.Cause())
	}

	// Stopped by StopAll only: no death.
	var quiet Group
	ch := make(chan struct{})
	quiet.Add("metrics", func() { close(ch) }, ch)
	quiet.StopAll()
	// StopAll closes its stopping signal before it stops a part, so the
	// watcher can never take this stop for a death.
	select {
	case <-quiet.Died():
		t.Fatal("Died closed by StopAll")
	default:
	}
	t.Logf("%d parts stopped in reverse order", len(order))
}
