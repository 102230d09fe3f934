package lease

import "context"

// StartAgain starts k's lifecycle a second time, as a component's second
// Start would: the lifecycle test expects it to fail.
func (k *Keeper) StartAgain(ctx context.Context) error {
	_, err := k.life.Start(ctx, "lease: keeper")
	return err
}
