package dev.fencegate;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.Test;

/**
 * The Keeper against the real PostgreSQL: renewals on the real clock, and,
 * on a clock the test drives, when trust ends. (That the default clock is
 * the monotonic one, whatever the wall clock does, is the pause test's:
 * clients/java/java_test.go.)
 */
public class KeeperTest {
    private static final long MINUTE = TimeUnit.MINUTES.toNanos(1);

    /** The connections of the worker role, one per call, as a pool's. */
    private static Connection conn() throws SQLException {
        return TestEnv.worker();
    }

    private static Fencegate client() throws SQLException {
        try (Connection c = TestEnv.worker()) {
            return TestEnv.client(c);
        }
    }

    private static long grants(String resource) throws SQLException {
        return TestEnv.count("SELECT count(*) FROM fencegate.epoch_grants WHERE resource_id = ?", resource);
    }

    /** Polls cond for up to timeout: no fixed sleeps. */
    private static void await(String what, Duration timeout, java.util.function.BooleanSupplier cond) throws InterruptedException {
        long end = System.nanoTime() + timeout.toNanos();
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() - end > 0) {
                throw new AssertionError("not within " + timeout + ": " + what);
            }
            Thread.sleep(10);
        }
    }

    @Test
    public void aBadConfigurationGrantsNothing() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        Object[][] configs = {
            {"ttl: ", KeeperConfig.of(Duration.ofMillis(5))},
            {"ttl: ", KeeperConfig.of(null)},
            {"ttl: ", KeeperConfig.of(Duration.ofHours(25))},
            {"margin: ", KeeperConfig.of(Duration.ofSeconds(3)).withMargin(Duration.ofSeconds(3))},
            {"margin: ", KeeperConfig.of(Duration.ofSeconds(3)).withMargin(Duration.ofSeconds(-1))},
            {"renew_every: ", KeeperConfig.of(Duration.ofSeconds(3)).withRenewEvery(Duration.ofMillis(2700))},
            {"renew_every: ", KeeperConfig.of(Duration.ofSeconds(3)).withRenewEvery(Duration.ZERO)},
        };
        for (Object[] c : configs) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> Keeper.hold(fg, KeeperTest::conn, r, "worker-a", (KeeperConfig) c[1]));
            assertTrue(e.getMessage(), e.getMessage().startsWith((String) c[0]));
        }
        assertEquals(0, grants(r));
    }

    @Test
    public void renewsOnTheRealClockUntilClosedThenReleases() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        try (Connection own = TestEnv.worker()) { // its own connection, auto-commit off: the keeper commits
            Keeper k = Keeper.hold(fg, own, r, "worker-a", KeeperConfig.of(Duration.ofMillis(600)));
            long epoch = k.epoch();
            Set<Instant> expiries = new HashSet<>();
            expiries.add(k.lease().expiresAt());
            await("three renewals", Duration.ofSeconds(10), () -> {
                assertTrue("trusted while renewing", k.stillValid());
                expiries.add(k.lease().expiresAt());
                return expiries.size() >= 4;
            });
            assertEquals(epoch, k.epoch());
            assertNull(k.err());
            assertFalse(k.done().isDone());
            assertEquals(1, grants(r));
            assertEquals(1, TestEnv.count("SELECT count(*) FROM fencegate.resources WHERE resource_id = ? AND holder = 'worker-a'"
                    + " AND lease_expires_at > now()", r));

            k.release();
            assertTrue(k.done().isDone());
            assertTrue("closing is not a loss", k.done().get() instanceof CancellationException);
            assertFalse(k.stillValid());
            LeaseLostException e = assertThrows(LeaseLostException.class, k::checkValid);
            assertTrue(e.getMessage(), e.getMessage().startsWith("keeper closed"));
            k.close(); // idempotent
            assertEquals(1, TestEnv.count("SELECT count(*) FROM fencegate.resources WHERE resource_id = ? AND holder IS NULL", r));
        }
    }

    @Test
    public void trustIsMeasuredFromTheStartOfTheLastRenewal() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        AtomicLong clock = new AtomicLong(1_000 * MINUTE);
        AtomicLong slow = new AtomicLong();
        long t0 = clock.get();
        // TTL 1h: window 54 min (margin 6), renewals every 20 min of real
        // time, so none but the test's own run. A renewal's round trip takes
        // `slow` on this clock.
        KeeperConfig cfg = KeeperConfig.of(Duration.ofHours(1)).withClock(clock::get);
        try (Keeper k = Keeper.hold(fg, () -> {
            clock.addAndGet(slow.get());
            return conn();
        }, r, "worker-a", cfg)) {
            assertTrue(k.stillValid());
            clock.set(t0 + 30 * MINUTE);
            slow.set(10 * MINUTE);
            k.renewOnce(); // began at 30 min, answered at 40
            assertEquals(t0 + 40 * MINUTE, clock.get());
            clock.set(t0 + 83 * MINUTE);
            assertTrue("trusted until 30 + 54 min", k.stillValid());
            assertFalse(k.done().isDone());
            clock.set(t0 + 84 * MINUTE);
            assertFalse("measured from the renewal's start (30 min), not its end (40)", k.stillValid());
            Exception why = k.done().get(0, TimeUnit.SECONDS);
            assertTrue(String.valueOf(why), why instanceof LeaseLostException);
            assertTrue(why.getMessage(), why.getMessage().endsWith("no successful renewal within PT54M"));
            assertSame(why, k.err());
            LeaseLostException e = assertThrows(LeaseLostException.class, k::checkValid);
            assertSame(why, e.getCause());
            clock.set(t0); // a clock that went back changes nothing once lost
            assertFalse(k.stillValid());
        }
    }

    /**
     * A lease handed to keep some time after its grant is renewed on the
     * grant's clock: the first renewal is due renewEvery after grantedAt,
     * not after keep, so an overdue one starts at once instead of after the
     * deadline. (A slow acquire inside hold, whose reading precedes its
     * request, is the same case: it made trustEndsOnTimeWhileARenewalHangs
     * flaky on a loaded machine.)
     */
    @Test
    public void aLateGrantIsRenewedOnItsOwnClock() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        Lease l;
        try (Connection c = conn()) {
            l = fg.acquire(c, r, "worker-a", Duration.ofSeconds(6));
            c.commit();
        }
        // Trust window 5.4 s, renewals every 2 s, granted 4 s "ago" (earlier
        // than the truth: a safe lie): the deadline is 1.4 s away. Timed
        // from keep, the first renewal would start at 2 s, after it.
        long grantedAt = System.nanoTime() - TimeUnit.SECONDS.toNanos(4);
        try (Keeper k = Keeper.keep(fg, KeeperTest::conn, l, grantedAt, KeeperConfig.of(Duration.ofSeconds(6)))) {
            await("a renewal", Duration.ofSeconds(3),
                    () -> k.done().isDone() || !k.lease().expiresAt().equals(l.expiresAt()));
            assertFalse("lost before renewing once: " + k.err(), k.done().isDone());
            assertTrue(k.stillValid());
        }
    }

    @Test
    public void trustEndsOnTimeWhileARenewalHangs() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        CountDownLatch hung = new CountDownLatch(1);
        AtomicInteger calls = new AtomicInteger();
        long start = System.nanoTime();
        Keeper k = Keeper.hold(fg, () -> {
            if (calls.incrementAndGet() > 1) { // the acquire passes; every renewal hangs
                try {
                    hung.await(30, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    throw new SQLException("interrupted", e);
                }
            }
            return conn();
        }, r, "worker-a", KeeperConfig.of(Duration.ofSeconds(1)));
        // The renewal is due 333 ms after the grant, the deadline at 900 ms:
        // 567 ms of slack for the renewal thread to start on a loaded machine.
        try {
            Exception why = k.done().get(10, TimeUnit.SECONDS);
            long took = System.nanoTime() - start;
            assertTrue(String.valueOf(why), why instanceof LeaseLostException);
            assertTrue("lost after " + took / 1_000_000 + " ms, before TTL - margin (900 ms)", took >= TimeUnit.MILLISECONDS.toNanos(900));
            assertFalse(k.stillValid());
            assertEquals(2, calls.get());
        } finally {
            hung.countDown();
            k.close();
        }
    }

    @Test
    public void aRefusedRenewalLosesTheLease() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        AtomicLong clock = new AtomicLong();
        try (Keeper k = Keeper.hold(fg, KeeperTest::conn, r, "worker-a", KeeperConfig.of(Duration.ofHours(1)).withClock(clock::get))) {
            long newer;
            try (Connection c = TestEnv.worker()) {
                // The same holder acquires again (a worker loop's next
                // hold): every grant is a new epoch, and the old one is fenced.
                newer = fg.acquire(c, r, "worker-a", Duration.ofMinutes(1)).epoch();
                c.commit();
            }
            assertTrue(k.stillValid());
            k.renewOnce();
            assertFalse(k.stillValid());
            Exception why = k.done().get(0, TimeUnit.SECONDS);
            assertTrue(String.valueOf(why), why instanceof LeaseLostException);
            StaleEpochException cause = (StaleEpochException) why.getCause();
            assertEquals(newer, cause.currentEpoch());
            assertEquals(k.epoch(), cause.suppliedEpoch());
        }
    }

    @Test
    public void aFailedRenewalIsRetried() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        AtomicInteger calls = new AtomicInteger();
        try (Keeper k = Keeper.hold(fg, () -> {
            int n = calls.incrementAndGet();
            if (n == 2 || n == 3) { // the first two renewals find no database
                throw new SQLException("connection refused", "08001");
            }
            return conn();
        }, r, "worker-a", KeeperConfig.of(Duration.ofSeconds(2)))) {
            Instant first = k.lease().expiresAt();
            await("a renewal after two failures", Duration.ofSeconds(10), () -> k.lease().expiresAt().isAfter(first));
            assertTrue(calls.get() >= 4);
            assertTrue(k.stillValid());
            assertNull(k.err());
        }
    }
}
