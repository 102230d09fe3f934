import { Lease, Queryable } from './client';
import { LeaseLostError } from './errors';
/** A monotonic clock in nanoseconds. */
export type Clock = () => bigint;
/** The default clock: monotonic, unaffected by steps of the wall clock. */
export declare const monotonicNs: Clock;
/** A connection of the Keeper's own. */
export interface KeeperConnection extends Queryable {
    end(): Promise<void>;
    /**
     * node-postgres's Client is an EventEmitter that emits 'error' when its
     * connection is lost while idle (a restart, a failover, an idle timeout,
     * pg_terminate_backend); unheard, that ends the process. The Keeper
     * listens on its own connections, and renews on a new one.
     */
    on?(event: 'error', listener: (err: Error) => void): unknown;
}
export interface KeeperOptions {
    /** Opens a new connection for the Keeper (e.g. `async () => { const c = new pg.Client(url); await c.connect(); return c; }`). */
    connect: () => Promise<KeeperConnection>;
    resource: string;
    holder: string;
    /** The lease's time to live, in milliseconds. */
    ttlMs: number;
    /** The renewal interval. Default ttlMs/3. */
    renewEveryMs?: number;
    /** How long before the lease's expiry it stops being trusted. Default ttlMs/10. */
    marginMs?: number;
    schema?: string;
    /** The monotonic clock, in nanoseconds (tests may give another). */
    clock?: Clock;
    /**
     * Keep a lease acquired elsewhere (with grantedAt, a clock reading taken
     * just before its acquire) instead of acquiring one: the Lease that
     * acquire returned, whose ttlMs the first trust window is scaled to (a
     * lease granted for 1 s is not trusted as one of ttlMs); the renewals
     * then extend it by ttlMs.
     */
    lease?: Lease;
    grantedAt?: bigint;
    /** Stop with the signal of an AbortController of yours too. */
    signal?: AbortSignal;
    /**
     * How long stop, close and release may take when the database does not
     * answer (default 10 000 ms): past it the Keeper's connection is
     * destroyed, and release throws (the lease then expires with its TTL).
     */
    releaseTimeoutMs?: number;
}
/** The default bound of stop, close and release. */
export declare const DEFAULT_RELEASE_TIMEOUT_MS = 10000;
/**
 * Holds a lease and keeps it renewed in the background, on a connection of
 * its own. `signal` is aborted as soon as the lease can no longer be trusted
 * (its reason a LeaseLostError: `expired` when TTL − margin passed on the
 * monotonic clock since the last successful renewal began, `stale_epoch`
 * when a renewal was refused), or when the Keeper is stopped.
 *
 *     const keeper = await Keeper.hold({ connect, resource: 'invoices', holder: 'worker-a', ttlMs: 10_000 });
 *     try { ... keeper.epoch, keeper.stillValid(), keeper.signal ... } finally { await keeper.release(); }
 */
export declare class Keeper {
    private conn;
    private fg;
    private readonly opts;
    private readonly clock;
    private readonly controller;
    private leaseNow;
    private lastOk;
    private lost;
    private stopping;
    private renewing;
    private renewTimer;
    private deadlineTimer;
    private renewCount;
    private readonly ttl;
    private readonly margin;
    private readonly renewEvery;
    /** How long the lease is trusted from lastOk: TTL − margin, or less for a lease given with a shorter TTL, until it is renewed. */
    private window;
    private readonly releaseTimeoutMs;
    private broken;
    /** release or close ran: a connection opened after that is not kept. */
    private ended;
    private constructor();
    /** Acquires a lease (a new epoch; or keeps options.lease) and starts keeping it. */
    static hold(options: KeeperOptions): Promise<Keeper>;
    /** The lease as last renewed. */
    get lease(): Lease;
    /** The lease's epoch: pass it with every write. */
    get epoch(): number;
    /** Aborted when the lease can no longer be trusted, or the Keeper stopped; its reason says why. */
    get signal(): AbortSignal;
    /** Why the lease was lost, or undefined. */
    get error(): LeaseLostError | undefined;
    /** How many renewals succeeded. */
    get renewals(): number;
    /** The monotonic reading (ns) until which the lease is trusted. */
    trustedUntil(): bigint;
    /**
     * True while the lease can be trusted: not lost, not stopped, and the
     * monotonic deadline not passed (read now, not when a timer last ran).
     */
    stillValid(): boolean;
    /** Throws LeaseLostError (or the signal's reason) unless stillValid(). */
    check(): void;
    /**
     * Stops renewing and aborts the signal; a renewal in flight is cancelled
     * (its connection destroyed: the next call opens a new one). Does not
     * release. Idempotent. Takes at most releaseTimeoutMs.
     */
    stop(): Promise<void>;
    /**
     * Stops, releases the lease unless it was lost (a lease taken over
     * meanwhile is nothing to release), and closes the Keeper's connection.
     * Takes at most releaseTimeoutMs: when the database does not answer by
     * then, the connection is destroyed and it throws (the lease expires
     * with its TTL).
     */
    release(): Promise<void>;
    /** Stops and closes the Keeper's connection, without releasing. Takes at most releaseTimeoutMs. */
    close(): Promise<void>;
    private releaseNow;
    private reconnect;
    /**
     * conn emitted 'error': it is gone. Not a loss of the lease, which the
     * database still holds: renew now, on a new connection, as after a failed
     * renewal (the lease is lost if none succeeds before the deadline).
     */
    private connectionLost;
    [Symbol.asyncDispose](): Promise<void>;
    private expired;
    private lose;
    private pastDeadline;
    private armDeadline;
    private scheduleRenew;
    private renewOnce;
}
