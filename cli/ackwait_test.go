package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
)

// --ack-wait is the adapters' consumers' AckWait (how long after a crash
// the redelivery finishes an intent); without it, twice --execute-timeout
// and at least a minute.
func TestRunAckWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		want time.Duration
	}{
		{"given", []string{"--ack-wait", "7s", "--execute-timeout", "3s"}, 7 * time.Second},
		{"derived from the execute timeout", []string{"--execute-timeout", "45s"}, 90 * time.Second},
		{"default", nil, time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newRunEnv(t)
			p := e.run(t, nil, append([]string{"--adapters", "file", "--file-root", t.TempDir()}, c.args...)...)
			js, err := jetstream.New(natstest.Connect(t, e.natsURL))
			if err != nil {
				t.Fatal(err)
			}
			var got time.Duration
			pollUntil(t, 30*time.Second, "the file adapter's consumer", func() (bool, string) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if s := intentsStream(ctx, t, js); s != nil {
					for info := range s.ListConsumers(ctx).Info() {
						if strings.HasSuffix(info.Config.FilterSubject, ".file") {
							got = info.Config.AckWait
							return true, ""
						}
					}
				}
				return false, p.stderr.String()
			})
			if got != c.want {
				t.Fatalf("the file consumer's AckWait is %s, want %s", got, c.want)
			}
			p.stop(t)
		})
	}
}
