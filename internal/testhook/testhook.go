// Package testhook carries the hooks tests put into the relay loop and the
// adapter runtime, so that no public configuration exposes them. A test
// puts them into the context it gives to Start (WithDispatcher,
// WithRuntime); the component reads them once, at Start, and calls them
// at its points. Only packages of this module can set them (the package is
// internal); a context without hooks costs one lookup at Start.
package testhook

import "context"

// Dispatcher observes a dispatcher's relay loop. The hooks run on the
// dispatcher's goroutines and must not block for long. A nil hook is not
// called.
type Dispatcher struct {
	// Claimed is called after a claim committed, with what it claimed.
	Claimed func(dispatcherID string, claims []Claim)
	// Acked is called with a batch's intents that got their PubAck, before
	// they are marked relayed: a crash here leaves published intents
	// claimed and `pending`.
	Acked func(dispatcherID string, intentIDs []int64)
}

// Claim is one intent a dispatcher claimed.
type Claim struct {
	IntentID int64
	// Relay is the relay number the claim publishes (relay_count+1).
	Relay int
	// Rerelay is true when the intent had been relayed before and timed out.
	Rerelay bool
}

// Runtime injects crashes and races into an adapter runtime. The hooks run
// on the goroutine handling the delivery. A nil hook is not called.
type Runtime struct {
	// AfterEffect is called after an executor returned and before its
	// outcome is recorded (crash injection).
	AfterEffect func(intentID int64)
	// AfterLoad is called after an intent was loaded and before its fence
	// is checked (race injection).
	AfterLoad func(intentID int64)
	// FenceChecked is called with the epoch the execute fence read for an
	// intent, before it acts on it (a test checks its race was reached).
	FenceChecked func(intentID, current int64)
}

type dispatcherKey struct{}

type runtimeKey struct{}

// WithDispatcher returns ctx carrying h for the dispatcher started with it.
func WithDispatcher(ctx context.Context, h Dispatcher) context.Context {
	return context.WithValue(ctx, dispatcherKey{}, h)
}

// DispatcherFrom returns the dispatcher hooks ctx carries; zero: none.
func DispatcherFrom(ctx context.Context) Dispatcher {
	h, _ := ctx.Value(dispatcherKey{}).(Dispatcher)
	return h
}

// WithRuntime returns ctx carrying h for the adapter runtime started with
// it.
func WithRuntime(ctx context.Context, h Runtime) context.Context {
	return context.WithValue(ctx, runtimeKey{}, h)
}

// RuntimeFrom returns the runtime hooks ctx carries; zero: none.
func RuntimeFrom(ctx context.Context) Runtime {
	h, _ := ctx.Value(runtimeKey{}).(Runtime)
	return h
}
