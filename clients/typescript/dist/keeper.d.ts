import { Lease, Queryable } from './client';
import { LeaseLostError } from './errors';
/** A monotonic clock in nanoseconds. */
export type Clock = () => bigint;
/** The default clock: monotonic, unaffected by steps of the wall clock. */
export declare const monotonicNs: Clock;
/** A connection of the Keeper's own. */
export interface KeeperConnection extends Queryable {
    end(): Promise<void>;
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
    /** Keep a lease acquired elsewhere (with grantedAt, a clock reading taken just before its acquire) instead of acquiring one. */
    lease?: Lease;
    grantedAt?: bigint;
    /** Stop with the signal of an AbortController of yours too. */
    signal?: AbortSignal;
}
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
    private broken;
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
    /** Stops renewing and aborts the signal; waits for a renewal in flight. Does not release. Idempotent. */
    stop(): Promise<void>;
    /** Stops, releases the lease unless it was lost, and closes the Keeper's connection. */
    release(): Promise<void>;
    /** Stops and closes the Keeper's connection, without releasing. */
    close(): Promise<void>;
    [Symbol.asyncDispose](): Promise<void>;
    private expired;
    private lose;
    private pastDeadline;
    private armDeadline;
    private scheduleRenew;
    private renewOnce;
}
