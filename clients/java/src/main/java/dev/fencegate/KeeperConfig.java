package dev.fencegate;

import java.time.Duration;
import java.util.function.LongSupplier;

/**
 * How a {@link Keeper} keeps its lease: Go's {@code lease.KeeperConfig}.
 * Start from {@link #of(Duration)}; a null field takes its default.
 *
 * @param ttl the lease's time to live, as granted: 10ms to 24h. Required.
 * @param renewEvery how often to renew; default ttl/3. Positive and below ttl − margin.
 * @param margin how long before the lease's expiry the keeper stops
 *     trusting it, to absorb clock rate differences and scheduling delay;
 *     default ttl/10. At least 0 and below ttl.
 * @param clock the clock the keeper measures its trust on, in nanoseconds;
 *     default {@link System#nanoTime()}, which is monotonic: a step of the
 *     wall clock (NTP, an operator, a VM restored) changes nothing. Give
 *     another only to test.
 * @param releaseTimeout how long {@link Keeper#close()} and
 *     {@link Keeper#release()} may take when the database does not answer;
 *     default 10 s. Positive.
 */
public record KeeperConfig(Duration ttl, Duration renewEvery, Duration margin, LongSupplier clock,
        Duration releaseTimeout) {

    private static final Duration MIN_TTL = Duration.ofMillis(10);
    private static final Duration MAX_TTL = Duration.ofHours(24);
    /** The default {@link #releaseTimeout()}. */
    public static final Duration DEFAULT_RELEASE_TIMEOUT = Duration.ofSeconds(10);

    /** A configuration without a release timeout of its own (the default). */
    public KeeperConfig(Duration ttl, Duration renewEvery, Duration margin, LongSupplier clock) {
        this(ttl, renewEvery, margin, clock, null);
    }

    /** A configuration for ttl with the defaults. */
    public static KeeperConfig of(Duration ttl) {
        return new KeeperConfig(ttl, null, null, null, null);
    }

    /** This configuration renewing every d. */
    public KeeperConfig withRenewEvery(Duration d) {
        return new KeeperConfig(ttl, d, margin, clock, releaseTimeout);
    }

    /** This configuration with margin d. */
    public KeeperConfig withMargin(Duration d) {
        return new KeeperConfig(ttl, renewEvery, d, clock, releaseTimeout);
    }

    /** This configuration measuring on clock (nanoseconds). */
    public KeeperConfig withClock(LongSupplier c) {
        return new KeeperConfig(ttl, renewEvery, margin, c, releaseTimeout);
    }

    /** This configuration with release timeout d. */
    public KeeperConfig withReleaseTimeout(Duration d) {
        return new KeeperConfig(ttl, renewEvery, margin, clock, d);
    }

    /** This configuration with its null fields set to their defaults. */
    KeeperConfig withDefaults() {
        return new KeeperConfig(ttl,
                renewEvery != null || ttl == null ? renewEvery : ttl.dividedBy(3),
                margin != null || ttl == null ? margin : ttl.dividedBy(10),
                clock != null ? clock : System::nanoTime,
                releaseTimeout != null ? releaseTimeout : DEFAULT_RELEASE_TIMEOUT);
    }

    /** Checks a configuration with its defaults, naming the field at fault. */
    void validate() {
        if (ttl == null || ttl.compareTo(MIN_TTL) < 0 || ttl.compareTo(MAX_TTL) > 0) {
            throw new IllegalArgumentException("ttl: must be between 10ms and 24h, got " + ttl);
        }
        if (margin == null || margin.isNegative() || margin.compareTo(ttl) >= 0) {
            throw new IllegalArgumentException("margin: must be at least 0 and below the ttl (" + ttl + "), got " + margin);
        }
        Duration window = ttl.minus(margin);
        if (renewEvery == null || renewEvery.isNegative() || renewEvery.isZero() || renewEvery.compareTo(window) >= 0) {
            throw new IllegalArgumentException("renew_every: must be positive and below ttl-margin (" + window + "), got "
                    + renewEvery);
        }
        if (releaseTimeout == null || releaseTimeout.isNegative() || releaseTimeout.isZero()) {
            throw new IllegalArgumentException("release_timeout: must be positive, got " + releaseTimeout);
        }
    }
}
