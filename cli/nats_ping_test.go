package cli

import "testing"

// `gateway run --nats-ping-interval` (how soon a hung NATS server is left
// for another seed: test/cluster) refuses a bound that is not positive
// before connecting, from the flag or the environment.
func TestRunNATSPingIntervalFlag(t *testing.T) {
	t.Parallel()
	runBadFlags(t, nil, []string{"--adapters", "", "--nats-ping-interval", "0s"}, "nats_ping_interval")
	runBadFlags(t, nil, []string{"--adapters", "", "--nats-ping-interval", "-2s"}, "nats_ping_interval")
	runBadFlags(t, []string{"GATEWAY_NATS_PING_INTERVAL=0s"}, []string{"--adapters", ""}, "nats_ping_interval")
}
