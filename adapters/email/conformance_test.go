package email_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
)

// TestConformance runs the adapter conformance suite against a real
// Mailpit, with MailpitLookup as the result lookup.
func TestConformance(t *testing.T) {
	t.Parallel()
	mp := smtptest.StartMailpit(t)
	adaptertest.Run(t, adaptertest.Harness{
		New: func(t *testing.T) adapters.Executor {
			return newMailpitAdapter(t, mp, mp.SMTPAddr, 10*time.Second)
		},
		Payload: func(i int) json.RawMessage {
			b, _ := json.Marshal(map[string]any{
				"to":      []string{fmt.Sprintf("user%d@example.com", i)},
				"from":    "Fencegate <gate@example.com>",
				"subject": fmt.Sprintf("conformance %d", i),
				"text":    fmt.Sprintf("payload %d\n", i),
			})
			return b
		},
		Effects: func(t *testing.T, req adapters.Request) int {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			n, err := mp.CountMessageID(ctx, email.MessageID(req.IdempotencyKey, ""))
			if err != nil {
				t.Fatalf("count at Mailpit: %v", err)
			}
			return n
		},
		HasLookup: true,
	})
}
