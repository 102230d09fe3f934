package dispatcher_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
)

// BenchmarkRelay compares the relay's throughput on N pre-committed intents
// (512-byte payloads) with raw JetStream async publishing of N messages of
// the same size, headers and message ids, on the same server in the same
// run. Metrics: relay_msgs/s, raw_msgs/s and relay/raw (goal ≥ 0.7).
func BenchmarkRelay(b *testing.B) {
	const n = 20000
	e := setup(b)
	ctx := context.Background()
	// The stream exists before either side is timed.
	if _, err := e.js.CreateOrUpdateStream(ctx, dispatcher.Config{Schema: testdb.Schema()}.StreamConfig()); err != nil {
		b.Fatal(err)
	}
	var relayTime, rawTime time.Duration
	var raw int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e.backlog(n, 512)
		nc, err := nats.Connect(e.url)
		if err != nil {
			b.Fatal(err)
		}
		d, err := dispatcher.New(e.pool, nc, dispatcher.Config{Schema: testdb.Schema(), BatchSize: 1000, MaxInFlight: 8192, DisableListen: true,
			PollInterval: 10 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		start := time.Now()
		if err := d.Start(ctx); err != nil {
			b.Fatal(err)
		}
		for {
			var left bool
			if err := e.pool.QueryRow(ctx, testdb.SQL(`SELECT EXISTS (SELECT 1 FROM fencegate.intents WHERE status = 'pending')`)).Scan(&left); err != nil {
				b.Fatal(err)
			}
			if !left {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		relayTime += time.Since(start)
		d.Stop()
		nc.Close()

		start = time.Now()
		publishRaw(b, e.url, n, raw)
		raw += n
		rawTime += time.Since(start)
	}
	b.StopTimer()
	relayRate := float64(n*b.N) / relayTime.Seconds()
	rawRate := float64(n*b.N) / rawTime.Seconds()
	b.ReportMetric(relayRate, "relay_msgs/s")
	b.ReportMetric(rawRate, "raw_msgs/s")
	b.ReportMetric(relayRate/rawRate, "relay/raw")
	b.ReportMetric(0, "ns/op")
}

// publishRaw publishes n 512-byte messages with async publish and the same
// window as the relay, and waits for every PubAck.
func publishRaw(b *testing.B, url string, n, offset int) {
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"target":"out/x","content":"` + strings.Repeat("x", 512-30) + `"}`)
	for i := range n {
		id := int64(1_000_000_000 + offset + i)
		m := nats.NewMsg(wire.Namespace("").Subject("raw"))
		m.Data = body
		m.Header.Set(jetstream.MsgIDHeader, wire.Namespace("").MsgID(id, 1))
		m.Header.Set(wire.HeaderIntentID, strconv.FormatInt(id, 10))
		m.Header.Set(wire.HeaderResource, "backlog")
		m.Header.Set(wire.HeaderEpoch, "1")
		m.Header.Set(wire.HeaderKind, "raw")
		m.Header.Set(wire.HeaderIdempotencyKey, "key")
		m.Header.Set(wire.HeaderFence, "execute")
		m.Header.Set(wire.HeaderRelay, "1")
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("raw publish: PubAcks did not complete")
	}
}
