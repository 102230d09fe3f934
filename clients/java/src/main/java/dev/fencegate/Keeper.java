package dev.fencegate;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.SQLTimeoutException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.LongSupplier;

/**
 * Keeps a lease renewed in the background, every TTL/3, and says as soon
 * as it can no longer be trusted: Go's {@code lease.Keeper}.
 *
 * <p>Trust is measured on a monotonic clock, {@link System#nanoTime()}:
 * the lease is trusted until TTL − margin has passed since the
 * <em>start</em> of the last successful renewal (or of the acquire that
 * granted it). The start, not the end, because the database set the expiry
 * at some moment after the request left. The wall clock is never read, so
 * a step of it (NTP, a restored VM) cannot extend a lease; a process paused
 * past its TTL (a GC pause, SIGSTOP, a frozen VM) finds, when it resumes,
 * that {@link #stillValid()} is false and {@link #done()} completed.
 *
 * <p>A keeper narrows the window in which a paused worker acts on a lost
 * lease; it cannot close it: a process paused right after checking and
 * before writing still writes late. Only the epoch check of the write
 * ({@link Fencegate#enqueue}'s {@link StaleEpochException}) refuses that
 * write: always pass {@link #epoch()} with every side effect.
 *
 * <p>Renewals run on the keeper's own threads, each on a connection of its
 * own: a dedicated {@link Connection} (used by nothing else while the
 * keeper runs) or one from a {@link ConnectionSource} per renewal (a
 * pool's). {@link #close()} stops renewing and waits for the renewal in
 * flight; it does not release the lease ({@link #release()} does). Both
 * take at most {@link KeeperConfig#releaseTimeout()} (10 s unless
 * configured) when the database does not answer: the connection in use is
 * then aborted ({@link Connection#abort}).
 *
 * <pre>{@code
 * try (Keeper keeper = Keeper.hold(fg, dataSource::getConnection, "invoices", "worker-1",
 *         KeeperConfig.of(Duration.ofSeconds(30)))) {
 *     while (keeper.stillValid()) { ... write with keeper.epoch() ... }
 * }
 * }</pre>
 */
public final class Keeper implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(Keeper.class.getName());

    /** How soon a failed renewal is retried, at most. */
    private static final long RETRY_NANOS = TimeUnit.MILLISECONDS.toNanos(100);

    private final Fencegate fg;
    private final ConnectionSource source;
    private final boolean closeConnections;
    private final LongSupplier clock;
    private final long renewEvery;
    /** The TTL it renews with: the configuration's. */
    private final Duration ttl;
    /** TTL − margin, in nanoseconds: how long a renewal's start is trusted. */
    private final long fullWindow;
    private final Duration releaseTimeout;
    private final ScheduledThreadPoolExecutor executor;
    private final CompletableFuture<Exception> done = new CompletableFuture<>();
    /** The executor's threads: close, called on one of them, cannot wait for them. */
    private final Set<Thread> threads = ConcurrentHashMap.newKeySet();

    private final Object mu = new Object();
    // Guarded by mu.
    private Lease lease;
    /** The clock's reading at the start of the last successful grant or renewal. */
    private long lastOK;
    /** Why the keeper stopped trusting the lease; null while it does. */
    private Exception reason;
    private ScheduledFuture<?> renewTask;
    private ScheduledFuture<?> deadlineTask;
    private Statement inFlight;
    /** The connection of the renewal in flight, aborted when it outlasts close's bound. */
    private Connection inFlightConn;
    /**
     * How long the lease is trusted from lastOK: {@link #fullWindow}, or
     * less for a lease given to {@link #keep} with a shorter TTL than the
     * configuration's (it expires sooner in the database), until renewed.
     */
    private long window;

    private Keeper(Fencegate fg, ConnectionSource source, boolean closeConnections, Lease lease, long grantedAt,
            KeeperConfig cfg) {
        this.fg = fg;
        this.source = source;
        this.closeConnections = closeConnections;
        this.clock = cfg.clock();
        this.renewEvery = cfg.renewEvery().toNanos();
        this.ttl = cfg.ttl();
        this.fullWindow = cfg.ttl().minus(cfg.margin()).toNanos();
        this.releaseTimeout = cfg.releaseTimeout();
        // A lease granted with a shorter TTL is trusted, and first renewed,
        // on its own TTL's scale.
        double scale = Math.min(1.0, (double) lease.ttl().toNanos() / cfg.ttl().toNanos());
        this.window = (long) (fullWindow * scale);
        this.lease = lease;
        this.lastOK = grantedAt;
        // Two threads: a renewal blocked on a slow database must not hold up
        // the deadline, which ends the trust on time.
        this.executor = new ScheduledThreadPoolExecutor(2, r -> {
            Thread t = new Thread(r, "fencegate-keeper " + lease.resource());
            t.setDaemon(true);
            threads.add(t);
            return t;
        });
        executor.setRemoveOnCancelPolicy(true);
        synchronized (mu) {
            // The first renewal is due renewEvery after the grant, on the
            // clock the trust window runs on: timed from here instead, a
            // grant that reached the keeper late (a slow acquire, whose
            // reading precedes its request, or keep long after it) would get
            // its first renewal after its deadline and lose a healthy lease.
            // An overdue one starts at once.
            long first = Math.max(0, grantedAt + (long) (renewEvery * scale) - clock.getAsLong());
            renewTask = executor.schedule(this::renewOnce, first, TimeUnit.NANOSECONDS);
            scheduleDeadlineLocked();
        }
    }

    /**
     * Acquires a lease on resource for holder (a new epoch, committed) and
     * keeps it, renewing on conn, which the keeper uses alone until closed
     * and does not close.
     *
     * @throws IllegalArgumentException for a bad configuration, before anything is granted
     * @throws LeaseHeldException another holder's lease is live
     */
    public static Keeper hold(Fencegate fg, Connection conn, String resource, String holder, KeeperConfig cfg)
            throws SQLException {
        return hold(fg, () -> conn, false, resource, holder, cfg);
    }

    /**
     * Acquires a lease on resource for holder (a new epoch, committed) and
     * keeps it, each renewal on a connection from source, closed after.
     *
     * @throws IllegalArgumentException for a bad configuration, before anything is granted
     * @throws LeaseHeldException another holder's lease is live
     */
    public static Keeper hold(Fencegate fg, ConnectionSource source, String resource, String holder, KeeperConfig cfg)
            throws SQLException {
        return hold(fg, source, true, resource, holder, cfg);
    }

    private static Keeper hold(Fencegate fg, ConnectionSource source, boolean close, String resource, String holder,
            KeeperConfig cfg) throws SQLException {
        KeeperConfig c = cfg.withDefaults();
        c.validate();
        // Read before the request leaves: the lease's expiry is set later.
        long start = c.clock().getAsLong();
        Lease l = call(source, close, conn -> fg.acquire(conn, resource, holder, c.ttl()));
        return new Keeper(fg, source, close, l, start, c);
    }

    /**
     * Keeps lease, acquired (and committed) by the caller; grantedAt is the
     * keeper's clock ({@link System#nanoTime()} unless configured) read
     * just before the acquire was sent. Renews on conn, used by the keeper
     * alone until closed. The lease is trusted no longer than the TTL it
     * was granted with ({@link Lease#ttl()}, scaled as the configuration's
     * TTL − margin) until its first renewal, which extends it by the
     * configuration's TTL.
     *
     * @throws IllegalArgumentException for a bad configuration, or a lease without its ttl
     */
    public static Keeper keep(Fencegate fg, Connection conn, Lease lease, long grantedAt, KeeperConfig cfg) {
        return keep(fg, () -> conn, false, lease, grantedAt, cfg);
    }

    /** {@link #keep(Fencegate, Connection, Lease, long, KeeperConfig)}, renewing on connections from source. */
    public static Keeper keep(Fencegate fg, ConnectionSource source, Lease lease, long grantedAt, KeeperConfig cfg) {
        return keep(fg, source, true, lease, grantedAt, cfg);
    }

    private static Keeper keep(Fencegate fg, ConnectionSource source, boolean close, Lease lease, long grantedAt,
            KeeperConfig cfg) {
        KeeperConfig c = cfg.withDefaults();
        c.validate();
        if (lease == null || lease.ttl() == null || lease.ttl().isNegative() || lease.ttl().isZero()) {
            throw new IllegalArgumentException("lease: its ttl is unknown: give the Lease that acquire returned"
                    + " (the keeper trusts a lease no longer than it was granted for)");
        }
        return new Keeper(fg, source, close, lease, grantedAt, c);
    }

    /** The lease as last renewed. */
    public Lease lease() {
        synchronized (mu) {
            return lease;
        }
    }

    /** The lease's epoch: pass it with every side effect. */
    public long epoch() {
        return lease().epoch();
    }

    /**
     * Whether the lease can still be trusted: the keeper runs and TTL −
     * margin has not passed, on its clock, since the last successful
     * renewal began. Once false, false for good; {@link #done()} has then
     * completed.
     */
    public boolean stillValid() {
        LeaseLostException lost;
        synchronized (mu) {
            if (reason != null) {
                return false;
            }
            if (clock.getAsLong() - (lastOK + window) < 0) {
                return true;
            }
            lost = expired();
            reason = lost;
        }
        stopped(lost);
        return false;
    }

    /**
     * Throws unless {@link #stillValid()}: the keeper's own
     * {@link LeaseLostException} ({@link #err()}, whose cause is the
     * refusal when a renewal was refused), as the Python and TypeScript
     * clients' check() raise theirs; after {@link #close()}, a new one
     * saying the keeper was closed.
     */
    public void checkValid() throws LeaseLostException {
        if (stillValid()) {
            return;
        }
        Exception why = err();
        if (why instanceof LeaseLostException lost) {
            throw lost;
        }
        throw new LeaseLostException("keeper closed: lease on " + lease().resource() + " no longer kept", why);
    }

    /**
     * Completes, with the reason, when the keeper stops trusting the lease:
     * a {@link LeaseLostException} when the lease was lost, a
     * {@link CancellationException} when the keeper was closed first.
     * Dependent actions given without an executor may run on the keeper's
     * thread: keep them short (the async variants for the rest).
     */
    public CompletableFuture<Exception> done() {
        return done;
    }

    /** Why the keeper stopped trusting the lease ({@link #done()}'s value), or null while it does. */
    public Exception err() {
        synchronized (mu) {
            return reason;
        }
    }

    /**
     * Stops renewing and waits for the renewal in flight, which is
     * cancelled, at most {@link KeeperConfig#releaseTimeout()}: a renewal
     * still running then (a database that does not answer) has its
     * connection aborted. Does not release the lease. Idempotent.
     */
    @Override
    public void close() {
        close(System.nanoTime() + releaseTimeout.toNanos());
    }

    private void close(long deadline) {
        Exception why = new CancellationException("keeper closed");
        boolean first;
        synchronized (mu) {
            first = reason == null;
            if (first) {
                reason = why;
            }
        }
        if (first) {
            stopped(why);
        }
        cancelInFlight();
        if (threads.contains(Thread.currentThread())) {
            return; // a done() action: the threads end once it returns
        }
        try {
            if (!executor.awaitTermination(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS)) {
                Connection c;
                synchronized (mu) {
                    c = inFlightConn;
                }
                LOG.log(System.Logger.Level.WARNING, "fencegate keeper: a renewal of {0} still runs {1} after close: its"
                        + " connection is aborted", lease().resource(), releaseTimeout);
                abort(c);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /**
     * Closes the keeper and releases the lease (committed), on a connection
     * of its own, all within {@link KeeperConfig#releaseTimeout()}. A lease
     * lost already (its loss in {@link #err()}), or taken over meanwhile,
     * is nothing to release: it returns without error.
     *
     * @throws SQLTimeoutException the database did not answer in time (the
     *     connection was aborted; the lease expires with its TTL)
     * @throws SQLException the release failed otherwise
     */
    public void release() throws SQLException {
        long deadline = System.nanoTime() + releaseTimeout.toNanos();
        close(deadline);
        if (err() instanceof LeaseLostException) {
            return; // lost: nothing of ours to release
        }
        Lease l = lease();
        AtomicReference<Connection> used = new AtomicReference<>();
        CompletableFuture<Void> f = new CompletableFuture<>();
        Thread t = new Thread(() -> {
            try {
                call(() -> {
                    Connection c = source.get();
                    used.set(c);
                    return c;
                }, closeConnections, conn -> {
                    fg.release(conn, l);
                    return null;
                });
                f.complete(null);
            } catch (StaleEpochException takenOver) {
                f.complete(null); // taken over meanwhile: nothing of ours to release
            } catch (Throwable e) {
                f.completeExceptionally(e);
            }
        }, "fencegate-keeper release " + l.resource());
        t.setDaemon(true);
        t.start();
        try {
            f.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            abort(used.get());
            throw new SQLTimeoutException("fencegate keeper: the release of the lease on " + l.resource() + " (epoch "
                    + l.epoch() + ") got no answer within " + releaseTimeout + ": it expires with its TTL");
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            if (c instanceof SQLException s) {
                throw s;
            }
            if (c instanceof RuntimeException r) {
                throw r;
            }
            if (c instanceof Error err) {
                throw err;
            }
            throw new SQLException(c);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            abort(used.get());
            throw new SQLException("fencegate keeper: interrupted while releasing", e);
        }
    }

    /** Aborts c (its socket closed: a statement waiting on it fails at once), quietly. */
    private static void abort(Connection c) {
        if (c == null) {
            return;
        }
        Executor daemon = r -> {
            Thread t = new Thread(r, "fencegate-keeper abort");
            t.setDaemon(true);
            t.start();
        };
        try {
            c.abort(daemon);
        } catch (SQLException | RuntimeException e) {
            // closed already
        }
    }

    /** The loss by the clock, for a lease whose window has passed. */
    private LeaseLostException expired() {
        Lease l = lease;
        return new LeaseLostException("lease on " + l.resource() + " (epoch " + l.epoch()
                + ") lost: no successful renewal within " + Duration.ofNanos(window), null);
    }

    /** Ends the trust with why, unless it ended already. */
    private void lose(Exception why) {
        synchronized (mu) {
            if (reason != null) {
                return;
            }
            reason = why;
        }
        stopped(why);
    }

    /**
     * After reason was set (once): completes done, cancels what is
     * scheduled, cancels the renewal in flight on the keeper's thread (the
     * caller may be the worker, in stillValid), and lets the threads end.
     */
    private void stopped(Exception why) {
        if (why instanceof LeaseLostException) {
            LOG.log(System.Logger.Level.WARNING, "fencegate keeper: {0}", why.getMessage());
        }
        ScheduledFuture<?> r;
        ScheduledFuture<?> d;
        synchronized (mu) {
            r = renewTask;
            d = deadlineTask;
        }
        if (r != null) {
            r.cancel(false);
        }
        if (d != null) {
            d.cancel(false);
        }
        try {
            executor.execute(this::cancelInFlight);
        } catch (java.util.concurrent.RejectedExecutionException alreadyShutDown) {
            // close() cancels it itself.
        }
        // Tasks taken before it still run; nothing is scheduled after
        // reason was set (renewOnce and checkDeadline look under mu).
        executor.shutdown();
        done.complete(why);
    }

    private void cancelInFlight() {
        Statement s;
        synchronized (mu) {
            s = inFlight;
        }
        if (s != null) {
            try {
                s.cancel();
            } catch (SQLException e) {
                // Closed meanwhile: nothing to cancel.
            }
        }
    }

    private void scheduleDeadlineLocked() {
        long left = lastOK + window - clock.getAsLong();
        deadlineTask = executor.schedule(this::checkDeadline, Math.max(0, left), TimeUnit.NANOSECONDS);
    }

    /** The deadline's own task, so that trust ends on time even while a renewal hangs. */
    private void checkDeadline() {
        LeaseLostException lost;
        synchronized (mu) {
            if (reason != null) {
                return;
            }
            if (clock.getAsLong() - (lastOK + window) < 0) { // renewed meanwhile
                scheduleDeadlineLocked();
                return;
            }
            lost = expired();
            reason = lost;
        }
        stopped(lost);
    }

    /** One renewal; schedules the next. Package-private: tests call it to renew now. */
    void renewOnce() {
        Lease l;
        synchronized (mu) {
            if (reason != null) {
                return;
            }
            l = lease;
        }
        long started = clock.getAsLong();
        try {
            Instant exp = call(source, closeConnections, conn -> {
                synchronized (mu) {
                    inFlightConn = conn;
                }
                // The configuration's TTL, which the trust window is made of
                // (not the TTL a lease given to keep was granted with).
                return fg.renew(conn, l.resource(), l.holder(), l.epoch(), ttl, this::track);
            });
            synchronized (mu) {
                inFlight = null;
                inFlightConn = null;
                if (reason != null) {
                    return;
                }
                lease = new Lease(l.resource(), l.holder(), l.epoch(), exp, ttl);
                lastOK = started;
                window = fullWindow;
                cancel(deadlineTask);
                scheduleDeadlineLocked();
                cancel(renewTask);
                renewTask = executor.schedule(this::renewOnce, renewEvery, TimeUnit.NANOSECONDS);
            }
        } catch (StaleEpochException e) {
            synchronized (mu) {
                inFlight = null;
                inFlightConn = null;
            }
            lose(new LeaseLostException("lease on " + l.resource() + " (epoch " + l.epoch() + ") lost: " + e.getMessage(), e));
        } catch (SQLException | RuntimeException e) {
            synchronized (mu) {
                inFlight = null;
                inFlightConn = null;
                if (reason != null) {
                    return;
                }
                LOG.log(System.Logger.Level.WARNING, "fencegate keeper: renew of {0} failed, retrying: {1}",
                        l.resource(), e.toString());
                cancel(renewTask);
                renewTask = executor.schedule(this::renewOnce, Math.min(renewEvery, RETRY_NANOS), TimeUnit.NANOSECONDS);
            }
        }
    }

    private static void cancel(ScheduledFuture<?> f) {
        if (f != null) {
            f.cancel(false);
        }
    }

    /**
     * Before a renewal runs: bound it by the time the lease is still
     * trusted (it is worthless after), and note it, for close and a loss
     * to cancel.
     */
    private void track(PreparedStatement st) throws SQLException {
        long left;
        synchronized (mu) {
            if (reason != null) {
                throw new SQLException("keeper stopped");
            }
            inFlight = st;
            left = lastOK + window - clock.getAsLong();
        }
        long secs = Math.max(1, Math.min(Integer.MAX_VALUE, (left + 999_999_999L) / 1_000_000_000L));
        st.setQueryTimeout((int) secs);
    }

    /** A call on a connection from source, committed, rolled back on error, the connection closed when close. */
    private interface Call<T> {
        T run(Connection conn) throws SQLException;
    }

    private static <T> T call(ConnectionSource source, boolean close, Call<T> f) throws SQLException {
        Connection conn = source.get();
        try {
            T v;
            try {
                v = f.run(conn);
                if (!conn.getAutoCommit()) {
                    conn.commit();
                }
            } catch (SQLException | RuntimeException e) {
                try {
                    if (!conn.getAutoCommit()) {
                        conn.rollback();
                    }
                } catch (SQLException r) {
                    e.addSuppressed(r);
                }
                throw e;
            }
            return v;
        } finally {
            if (close) {
                conn.close();
            }
        }
    }
}
