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

    /**
     * A database that stops answering: after the first {@code answered}
     * calls (the worker's connections), every call hangs until {@link
     * #thaw} (or {@code limit}), as a connection to a silent server does.
     */
    private static final class SilentSource implements ConnectionSource {
        final AtomicInteger calls = new AtomicInteger();
        private final CountDownLatch thawed = new CountDownLatch(1);
        private final int answered;
        private final Duration limit;

        SilentSource(int answered, Duration limit) {
            this.answered = answered;
            this.limit = limit;
        }

        @Override
        public Connection get() throws SQLException {
            if (calls.incrementAndGet() > answered) {
                try {
                    thawed.await(limit.toMillis(), TimeUnit.MILLISECONDS);
                } catch (InterruptedException e) {
                    throw new SQLException("interrupted", e);
                }
            }
            return conn();
        }

        void thaw() {
            thawed.countDown();
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
            // The keeper's own exception, not one wrapping it (whose cause
            // was then a LeaseLostException in place of the refusal).
            LeaseLostException e = assertThrows(LeaseLostException.class, k::checkValid);
            assertSame(why, e);
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
        SilentSource db = new SilentSource(1, Duration.ofSeconds(30)); // the acquire passes; every renewal hangs
        long start = System.nanoTime();
        Keeper k = Keeper.hold(fg, db, r, "worker-a", KeeperConfig.of(Duration.ofSeconds(1)));
        // The renewal is due 333 ms after the grant, the deadline at 900 ms:
        // 567 ms of slack for the renewal thread to start on a loaded machine.
        try {
            Exception why = k.done().get(10, TimeUnit.SECONDS);
            long took = System.nanoTime() - start;
            assertTrue(String.valueOf(why), why instanceof LeaseLostException);
            assertTrue("lost after " + took / 1_000_000 + " ms, before TTL - margin (900 ms)", took >= TimeUnit.MILLISECONDS.toNanos(900));
            assertFalse(k.stillValid());
            assertEquals(2, db.calls.get());
        } finally {
            db.thaw();
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
            // checkValid's exception has the refusal as its cause (it had
            // the LeaseLostException, which wrapped the refusal).
            LeaseLostException e = assertThrows(LeaseLostException.class, k::checkValid);
            assertSame(cause, e.getCause());
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

    /**
     * A lease acquired elsewhere for 1 s and kept by a keeper of 10 s
     * expires in the database after 1 s: it is trusted no longer (0.9 s, its
     * TTL less the margin, scaled), and renewed with the keeper's TTL. The
     * keeper renewed with the lease's TTL (1 s, every 3.3 s) and trusted it
     * 9 s.
     */
    @Test
    public void aLeaseGrantedShorterIsTrustedNoLonger() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        AtomicLong clock = new AtomicLong(1_000 * MINUTE);
        Lease l;
        try (Connection c = conn()) {
            l = fg.acquire(c, r, "worker-a", Duration.ofSeconds(1));
            c.commit();
        }
        SilentSource db = new SilentSource(0, Duration.ofSeconds(30)); // renewals get no answer: trust is the clock's alone
        Keeper k = Keeper.keep(fg, db, l, clock.get(), KeeperConfig.of(Duration.ofSeconds(10)).withClock(clock::get));
        try {
            clock.addAndGet(TimeUnit.MILLISECONDS.toNanos(890));
            assertTrue(k.stillValid());
            clock.addAndGet(TimeUnit.MILLISECONDS.toNanos(20));
            assertFalse("trusted past the lease it was given (1 s) as if it were the keeper's (10 s)", k.stillValid());
        } finally {
            db.thaw();
            k.close();
        }
        Lease made = new Lease(r, "worker-a", l.epoch(), l.expiresAt(), null);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Keeper.keep(fg, KeeperTest::conn, made, System.nanoTime(), KeeperConfig.of(Duration.ofSeconds(10))));
        assertTrue(e.getMessage(), e.getMessage().startsWith("lease: "));
    }

    /** A lease kept with a longer TTL than it was granted for is renewed with the keeper's TTL, not the lease's. */
    @Test
    public void aKeptLeaseIsRenewedWithTheKeepersTtl() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        long grantedAt = System.nanoTime();
        Lease l;
        try (Connection c = conn()) {
            l = fg.acquire(c, r, "worker-a", Duration.ofSeconds(1));
            c.commit();
        }
        try (Keeper k = Keeper.keep(fg, KeeperTest::conn, l, grantedAt, KeeperConfig.of(Duration.ofSeconds(6)))) {
            await("a renewal", Duration.ofSeconds(5), () -> k.done().isDone() || !k.lease().expiresAt().equals(l.expiresAt()));
            assertTrue("lost: " + k.err(), k.stillValid());
            assertEquals(Duration.ofSeconds(6), k.lease().ttl());
            assertEquals("renewed for 6 s, not the lease's 1 s", 1, TestEnv.count("SELECT count(*) FROM fencegate.resources"
                    + " WHERE resource_id = ? AND lease_expires_at > now() + interval '3 seconds'", r));
        }
    }

    /**
     * release after a takeover (or after the keeper lost the lease) is
     * nothing to do, as in Python and TypeScript: it threw
     * StaleEpochException, after the worker's transaction had committed.
     */
    @Test
    public void releaseAfterATakeoverIsNothingToDo() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        AtomicLong clock = new AtomicLong();
        Keeper k = Keeper.hold(fg, KeeperTest::conn, r, "worker-a", KeeperConfig.of(Duration.ofHours(1)).withClock(clock::get));
        long newer;
        try (Connection c = TestEnv.worker()) {
            newer = fg.acquire(c, r, "worker-a", Duration.ofMinutes(1)).epoch();
            c.commit();
        }
        assertTrue("not noticed yet", k.stillValid());
        k.release(); // taken over meanwhile: nothing of ours
        assertEquals(1, TestEnv.count("SELECT count(*) FROM fencegate.resources WHERE resource_id = ? AND epoch = ?"
                + " AND holder = 'worker-a' AND lease_expires_at > now()", r, newer));

        Keeper lost = Keeper.hold(fg, KeeperTest::conn, TestEnv.resource("keeper"), "worker-a",
                KeeperConfig.of(Duration.ofHours(1)).withClock(clock::get));
        clock.addAndGet(60 * MINUTE); // past its window: lost
        assertFalse(lost.stillValid());
        lost.release(); // lost: nothing to release
        assertTrue(lost.err() instanceof LeaseLostException);
    }

    /**
     * release has a bound (the release timeout, 10 s by default) when the
     * database stops answering: a renewal that gets no connection is
     * abandoned. close waited 30 s for it, then release waited on the
     * source again, without a bound.
     */
    @Test
    public void releaseHasABoundWhenTheDatabaseStopsAnswering() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        SilentSource db = new SilentSource(1, Duration.ofSeconds(60)); // the acquire passes; then no answer
        Keeper k = Keeper.hold(fg, db, r, "worker-a", KeeperConfig.of(Duration.ofSeconds(1)));
        try {
            assertTrue(k.done().get(10, TimeUnit.SECONDS) instanceof LeaseLostException);
            long start = System.nanoTime();
            k.release();
            long took = System.nanoTime() - start;
            assertTrue("release took " + took / 1_000_000 + " ms, past its bound (10 s)", took < TimeUnit.SECONDS.toNanos(12));
        } finally {
            db.thaw();
        }
    }

    /** A release that waits on the database longer than the release timeout is abandoned: SQLTimeoutException. */
    @Test
    public void aReleaseWithoutAnswerTimesOut() throws Exception {
        Fencegate fg = client();
        String r = TestEnv.resource("keeper");
        Keeper k = Keeper.hold(fg, KeeperTest::conn, r, "worker-a",
                KeeperConfig.of(Duration.ofMinutes(1)).withReleaseTimeout(Duration.ofSeconds(1)));
        try (Connection admin = java.sql.DriverManager.getConnection(TestEnv.env("FENCEGATE_TEST_ADMIN_URL"))) {
            admin.setAutoCommit(false);
            try (java.sql.PreparedStatement st = admin.prepareStatement(
                    "SELECT 1 FROM \"" + TestEnv.schema() + "\".resources WHERE resource_id = ? FOR UPDATE")) {
                st.setString(1, r);
                st.executeQuery().close();
            }
            long start = System.nanoTime();
            java.sql.SQLTimeoutException e = assertThrows(java.sql.SQLTimeoutException.class, k::release);
            long took = System.nanoTime() - start;
            assertTrue(e.getMessage(), e.getMessage().contains("no answer within PT1S"));
            assertTrue("took " + took / 1_000_000 + " ms", took < TimeUnit.SECONDS.toNanos(3));
            admin.rollback();
        }
    }
}
