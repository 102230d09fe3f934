// Keeper: a lease kept renewed, and told when it can no longer be trusted.
//
// Trust is judged on the monotonic clock (process.hrtime.bigint()): the
// lease is trusted until TTL − margin has passed since the *start* of the
// last successful renewal (or of the acquire that granted it). The start,
// not the end, because PostgreSQL set the expiry at some moment after the
// request left. The wall clock (Date.now) is never consulted, so a clock
// step cannot extend a lease; and a process that was paused (SIGSTOP, a VM
// freeze, swapping) sees on waking that the time is up before it asks the
// database anything.
//
// A Keeper narrows the window in which a paused worker acts on a lost
// lease; it cannot close it: a process paused right after stillValid() and
// before its write still writes late. Only the epoch check of the write
// (enqueue's fence) refuses that write: always pass keeper.epoch.
//
// This is Go's lease.Keeper (lease/keeper.go) in TypeScript, without its
// pause histogram.

import { Fencegate, DEFAULT_SCHEMA, Lease, Queryable } from './client';
import { LeaseLostError, StaleEpochError } from './errors';

/** A monotonic clock in nanoseconds. */
export type Clock = () => bigint;

/** The default clock: monotonic, unaffected by steps of the wall clock. */
export const monotonicNs: Clock = () => process.hrtime.bigint();

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

// A failed renewal (not a refusal) is retried this soon, or at the renewal
// interval if that is shorter.
const RETRY_MS = 100;
const ms = (v: number): bigint => BigInt(Math.round(v * 1e6));

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
export class Keeper {
  private readonly controller = new AbortController();
  private leaseNow: Lease;
  private lastOk: bigint;
  private lost: LeaseLostError | undefined;
  private stopping = false;
  private renewing: Promise<void> | undefined;
  private renewTimer: NodeJS.Timeout | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private renewCount = 0;
  private readonly ttl: bigint;
  private readonly margin: bigint;
  private readonly renewEvery: bigint;

  private broken = false;

  private constructor(
    private conn: KeeperConnection,
    private fg: Fencegate,
    private readonly opts: Required<Pick<KeeperOptions, 'ttlMs' | 'renewEveryMs' | 'marginMs'>> & KeeperOptions,
    private readonly clock: Clock,
    lease: Lease,
    grantedAt: bigint,
  ) {
    this.leaseNow = lease;
    this.lastOk = grantedAt;
    this.ttl = ms(opts.ttlMs);
    this.margin = ms(opts.marginMs);
    this.renewEvery = ms(opts.renewEveryMs);
  }

  /** Acquires a lease (a new epoch; or keeps options.lease) and starts keeping it. */
  static async hold(options: KeeperOptions): Promise<Keeper> {
    const ttlMs = options.ttlMs;
    const renewEveryMs = options.renewEveryMs ?? ttlMs / 3;
    const marginMs = options.marginMs ?? ttlMs / 10;
    if (!(ttlMs >= 10 && ttlMs <= 86_400_000)) throw new RangeError(`ttlMs: must be between 10ms and 24h, got ${ttlMs}`);
    if (!(marginMs >= 0 && marginMs < ttlMs)) throw new RangeError(`marginMs: must be at least 0 and below the ttl, got ${marginMs}`);
    if (!(renewEveryMs > 0 && renewEveryMs < ttlMs - marginMs)) {
      throw new RangeError(`renewEveryMs: must be positive and below ttl-margin (${ttlMs - marginMs}ms), got ${renewEveryMs}`);
    }
    const clock = options.clock ?? monotonicNs;
    const conn = await options.connect();
    let lease = options.lease;
    let grantedAt = options.grantedAt;
    let fg: Fencegate;
    try {
      fg = await Fencegate.attach(conn, { schema: options.schema ?? DEFAULT_SCHEMA });
      if (lease === undefined) {
        // Before the request leaves: the expiry PostgreSQL sets is later.
        grantedAt = clock();
        lease = await fg.acquire(options.resource, options.holder, ttlMs);
      } else if (grantedAt === undefined) {
        throw new TypeError('grantedAt: needed with lease (a clock reading taken before its acquire)');
      }
    } catch (e) {
      await conn.end().catch(() => {});
      throw e;
    }
    const k = new Keeper(conn, fg, { ...options, ttlMs, renewEveryMs, marginMs }, clock, lease, grantedAt!);
    options.signal?.addEventListener('abort', () => void k.stop(), { once: true });
    k.armDeadline();
    k.scheduleRenew(k.renewEvery - (clock() - k.lastOk));
    return k;
  }

  /** The lease as last renewed. */
  get lease(): Lease { return this.leaseNow; }
  /** The lease's epoch: pass it with every write. */
  get epoch(): number { return this.leaseNow.epoch; }
  /** Aborted when the lease can no longer be trusted, or the Keeper stopped; its reason says why. */
  get signal(): AbortSignal { return this.controller.signal; }
  /** Why the lease was lost, or undefined. */
  get error(): LeaseLostError | undefined { return this.lost; }
  /** How many renewals succeeded. */
  get renewals(): number { return this.renewCount; }

  /** The monotonic reading (ns) until which the lease is trusted. */
  trustedUntil(): bigint { return this.lastOk + this.ttl - this.margin; }

  /**
   * True while the lease can be trusted: not lost, not stopped, and the
   * monotonic deadline not passed (read now, not when a timer last ran).
   */
  stillValid(): boolean {
    return this.lost === undefined && !this.stopping && this.clock() < this.trustedUntil();
  }

  /** Throws LeaseLostError (or the signal's reason) unless stillValid(). */
  check(): void {
    if (this.stillValid()) return;
    if (this.lost) throw this.lost;
    if (this.stopping) throw new Error('the keeper was stopped');
    throw this.expired();
  }

  /** Stops renewing and aborts the signal; waits for a renewal in flight. Does not release. Idempotent. */
  async stop(): Promise<void> {
    if (!this.stopping) {
      this.stopping = true;
      clearTimeout(this.renewTimer);
      clearTimeout(this.deadlineTimer);
      if (!this.controller.signal.aborted) this.controller.abort(new Error('the keeper was stopped'));
    }
    await this.renewing;
  }

  /** Stops, releases the lease unless it was lost, and closes the Keeper's connection. */
  async release(): Promise<void> {
    await this.stop();
    try {
      if (this.lost === undefined) {
        const l = this.leaseNow;
        await this.fg.release(l.resource, l.holder, l.epoch).catch((e) => {
          if (!(e instanceof StaleEpochError)) throw e; // taken over meanwhile: nothing of ours
        });
      }
    } finally {
      await this.conn.end().catch(() => {});
    }
  }

  /** Stops and closes the Keeper's connection, without releasing. */
  async close(): Promise<void> {
    await this.stop();
    await this.conn.end().catch(() => {});
  }

  async [Symbol.asyncDispose](): Promise<void> { await this.release(); }

  private expired(): LeaseLostError {
    const s = (Number(this.ttl - this.margin) / 1e9).toFixed(3);
    return new LeaseLostError(
      `lease on ${JSON.stringify(this.leaseNow.resource)} (epoch ${this.leaseNow.epoch}) can no longer be trusted: no successful renewal within ${s}s (ttl less the margin) on the monotonic clock`,
      'expired');
  }

  private lose(err: LeaseLostError): void {
    if (this.lost !== undefined || this.stopping) return;
    this.lost = err;
    clearTimeout(this.renewTimer);
    clearTimeout(this.deadlineTimer);
    this.controller.abort(err);
  }

  // pastDeadline loses the lease when the deadline has passed: every timer
  // checks it first, so that after a pause past the deadline the lease is
  // not trusted again on the strength of a renewal that may or may not
  // still be granted.
  private pastDeadline(): boolean {
    if (this.clock() < this.trustedUntil()) return false;
    this.lose(this.expired());
    return true;
  }

  // The deadline has a timer of its own, so the signal is aborted on time
  // even while a renewal waits on a slow database.
  private armDeadline(): void {
    if (this.lost || this.stopping || this.pastDeadline()) return;
    const left = Number(this.trustedUntil() - this.clock()) / 1e6;
    this.deadlineTimer = setTimeout(() => this.armDeadline(), Math.max(1, Math.ceil(left)));
    this.deadlineTimer.unref?.();
  }

  private scheduleRenew(afterNs: bigint): void {
    if (this.lost || this.stopping) return;
    const wait = afterNs > 0n ? Number(afterNs) / 1e6 : 0;
    this.renewTimer = setTimeout(() => {
      if (this.lost || this.stopping || this.pastDeadline()) return;
      this.renewing = this.renewOnce();
    }, wait);
  }

  private async renewOnce(): Promise<void> {
    const l = this.leaseNow;
    try {
      if (this.broken) {
        // node-postgres does not reconnect a client: a new one.
        await this.conn.end().catch(() => {});
        this.conn = await this.opts.connect();
        this.fg = await Fencegate.attach(this.conn, { schema: this.fg.schema, checkVersion: false });
        this.broken = false;
      }
    } catch {
      this.scheduleRenew(ms(Math.min(this.opts.renewEveryMs, RETRY_MS)));
      this.renewing = undefined;
      return;
    }
    const started = this.clock();
    const left = Math.max(1, Math.floor(Number(this.trustedUntil() - started) / 1e6));
    try {
      // A renewal that cannot answer before the deadline is of no use.
      await this.conn.query('BEGIN');
      await this.conn.query(`SELECT set_config('statement_timeout', $1, true)`, [`${left}ms`]);
      const expiresAt = await this.fg.renew(l.resource, l.holder, l.epoch, this.opts.ttlMs);
      await this.conn.query('COMMIT');
      if (this.lost === undefined) {
        this.leaseNow = { ...l, expiresAt };
        this.lastOk = started;
        this.renewCount++;
        if (!this.stopping) {
          clearTimeout(this.deadlineTimer);
          this.armDeadline();
        }
      }
      this.scheduleRenew(this.renewEvery);
    } catch (e) {
      await this.conn.query('ROLLBACK').catch(() => {});
      if (e instanceof StaleEpochError) {
        this.lose(new LeaseLostError(
          `lease on ${JSON.stringify(l.resource)} (epoch ${l.epoch}) can no longer be trusted: ${e.message}`,
          'stale_epoch', { cause: e }));
        return;
      }
      // Not a refusal: the database unreachable, a timeout. Retry soon, on
      // a new connection (this one may be gone).
      this.broken = true;
      this.scheduleRenew(ms(Math.min(this.opts.renewEveryMs, RETRY_MS)));
    } finally {
      this.renewing = undefined;
    }
  }
}
