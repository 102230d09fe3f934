package clients_test

import (
	"context"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/jsonproc"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// keeperVariant is a Keeper the driver's keeper command runs.
type keeperVariant struct {
	name  string
	lang  int // index in langs
	extra []string
}

var keeperVariants = []keeperVariant{
	{"python", 0, nil},
	{"python-asyncio", 0, []string{"async"}},
	{"typescript", 1, nil},
}

// keeperResource is the resource the keepers of eachKeeper hold.
const keeperResource = "notes"

// eachKeeper runs test for each Keeper variant, in parallel, each on a
// database of its own (pool, as its owner) with a keeper (TTL ttlMs)
// holding keeperResource.
func eachKeeper(t *testing.T, ttlMs int, test func(t *testing.T, pool *pgxpool.Pool, p *jsonproc.Proc)) {
	for _, v := range keeperVariants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			pool, dbURL := database(t)
			test(t, pool, startKeeper(t, v, dbURL, "", keeperResource, ttlMs))
		})
	}
}

// startKeeper runs v's driver's keeper command: a Keeper of resource whose
// connections (to keeperURL, else dbURL) carry application_name
// fencegate-keeper, driven by lines on its input. It returns once the
// Keeper holds the lease.
func startKeeper(t *testing.T, v keeperVariant, dbURL, keeperURL, resource string, ttlMs int) *jsonproc.Proc {
	t.Helper()
	cmd := langs[v.lang].cmd(t)
	c := exec.Command(cmd[0], append(append(cmd[1:], "keeper", resource, "worker-a", itoa(int64(ttlMs))), v.extra...)...)
	c.Env = env(dbURL)
	if keeperURL != "" {
		c.Env = append(c.Env, "KEEPER_DATABASE_URL="+keeperURL)
	}
	p := jsonproc.Start(t, "the driver", c)
	if held := p.Next("held", 30*time.Second); held["event"] != "held" {
		t.Fatalf("the driver printed %v, want held", held)
	}
	return p
}

// renewed waits until the keeper has renewed resource's lease (its expiry
// moves later), at most d, and returns the new expiry.
func renewed(t *testing.T, pool *pgxpool.Pool, resource, what string, d time.Duration) time.Time {
	t.Helper()
	expiry := func() time.Time {
		var at time.Time
		if err := pool.QueryRow(context.Background(), testdb.SQL(`SELECT lease_expires_at FROM fencegate.resources WHERE resource_id = $1`), resource).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	first, last := expiry(), time.Time{}
	poll(t, what, d, func() bool { last = expiry(); return last.After(first) })
	return last
}

// released reads the keeper's answer to a release, which must be ok, and
// checks that nobody holds keeperResource after it: released, not left to
// expire.
func released(t *testing.T, pool *pgxpool.Pool, p *jsonproc.Proc, what string) {
	t.Helper()
	if r := p.Next("the release", 20*time.Second); r["ok"] != true {
		t.Errorf("release %s: %v", what, r)
	}
	var holder *string
	if err := pool.QueryRow(context.Background(), testdb.SQL(`SELECT holder FROM fencegate.resources WHERE resource_id = $1`), keeperResource).Scan(&holder); err != nil || holder != nil {
		t.Errorf("after the release %s the resource is held by %v (%v); want nobody (released, not left to expire)", what, holder, err)
	}
}

// A Keeper's connection lost while idle (pg_terminate_backend: a restart,
// a failover, an idle timeout) is not the end of the process: the Keeper
// renews on a new connection and still trusts its lease. TypeScript's
// Keeper had no 'error' listener on its connections, so node-postgres's
// 'error' event ended the process at once.
func TestKeeperAfterConnectionLoss(t *testing.T) {
	eachKeeper(t, 1500, func(t *testing.T, pool *pgxpool.Pool, p *jsonproc.Proc) {
		renewed(t, pool, keeperResource, "a renewal by the keeper", 5*time.Second)
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'fencegate-keeper' AND datname = current_database()`).Scan(&n); err != nil || n == 0 {
			t.Fatalf("terminating the keeper's connection: %d, %v", n, err)
		}
		// The next renewal, on a new connection.
		renewed(t, pool, keeperResource, "a renewal after the connection was lost", 5*time.Second)
		p.Send("check")
		got := p.Next("the check after the loss", 10*time.Second)
		if got["still_valid"] != true || got["reason"] != nil {
			t.Errorf("after its connection was lost and a renewal on a new one, the keeper says %v; want still valid", got)
		}
		p.Send("release")
		released(t, pool, p, "after the reconnect")
	})
}

// release while a renewal waits on the resource's control row (held FOR
// UPDATE by another transaction): the renewal is cancelled and the lease
// released once the row is free. The asyncio Keeper cancelled its renewal
// task mid-statement, which left psycopg's connection busy: the release
// failed ("another command is already in progress") and the lease stayed
// held until its TTL.
func TestKeeperReleaseDuringRenewal(t *testing.T) {
	eachKeeper(t, 3000, func(t *testing.T, pool *pgxpool.Pool, p *jsonproc.Proc) {
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, testdb.SQL(`SELECT 1 FROM fencegate.resources WHERE resource_id = $1 FOR UPDATE`), keeperResource); err != nil {
			t.Fatal(err)
		}
		// The renewal due 1 s after the grant waits on the row.
		poll(t, "the keeper's renewal waiting on the row", 5*time.Second, func() bool {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fencegate-keeper'
				AND datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		})
		p.Send("release")
		time.Sleep(300 * time.Millisecond)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		released(t, pool, p, "during a renewal")
	})
}

// frozenProxy forwards TCP connections to a PostgreSQL server until
// frozen: then it forwards nothing more, either way, and answers nothing
// (a network partition, a server that stops answering), until thawed.
type frozenProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen bool
	thawed *sync.Cond
}

func newFrozenProxy(t *testing.T, target string) *frozenProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &frozenProxy{ln: ln}
	p.thawed = sync.NewCond(&p.mu)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		p.freeze(false)
		_ = ln.Close()
		conns.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				done := make(chan struct{}, 2)
				go func() { p.copy(s, c); done <- struct{}{} }()
				go func() { p.copy(c, s); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return p
}

func (p *frozenProxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.frozen {
			p.thawed.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (p *frozenProxy) freeze(on bool) {
	p.mu.Lock()
	p.frozen = on
	p.mu.Unlock()
	p.thawed.Broadcast()
}

// stop, close and release have a bound when the database stops answering
// (a partition, a frozen server): release returns within the Keeper's
// release timeout (10 s by default), after the lease was lost and while it
// is still trusted. They waited for the renewal in flight without one.
func TestKeeperReleaseBounded(t *testing.T) {
	for _, v := range keeperVariants {
		for _, lostFirst := range []bool{true, false} {
			name := v.name + "/trusted"
			if lostFirst {
				name = v.name + "/lost"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				pool, dbURL := database(t)
				u, err := url.Parse(dbURL)
				if err != nil {
					t.Fatal(err)
				}
				proxy := newFrozenProxy(t, u.Host)
				u.Host = proxy.ln.Addr().String()
				p := startKeeper(t, v, dbURL, u.String(), keeperResource, 2000)
				renewed(t, pool, keeperResource, "a renewal by the keeper", 5*time.Second)
				proxy.freeze(true)
				if lostFirst {
					time.Sleep(2500 * time.Millisecond)
					p.Send("check")
					if got := p.Next("the check", 10*time.Second); got["still_valid"] != false || got["reason"] != "expired" {
						t.Fatalf("with the database silent past the TTL the keeper says %v; want lost, expired", got)
					}
				}
				p.Send("release")
				start := time.Now()
				r := p.Next("the release", 25*time.Second)
				took := time.Since(start)
				t.Logf("release with the database silent: %v after %s", r, took.Round(time.Millisecond))
				if took > 14*time.Second {
					t.Errorf("release took %s, past its bound (10 s)", took)
				}
				if lostFirst && r["ok"] != true {
					t.Errorf("release of a lost lease: %v; want nothing to do", r)
				}
				if !lostFirst {
					if msg, _ := r["error"].(string); r["ok"] != false || !strings.Contains(msg, "no answer within 10") {
						t.Errorf("release with the database silent: %v; want an error saying it got no answer within 10 s", r)
					}
				}
			})
		}
	}
}
