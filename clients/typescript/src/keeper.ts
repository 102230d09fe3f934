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

// A failed renewal (not a refusal) is retried this soon, or at the renewal
// interval if that is shorter.
const RETRY_MS = 100;
const ms = (v: number): bigint => BigInt(Math.round(v * 1e6));

/** The default bound of stop, close and release. */
export const DEFAULT_RELEASE_TIMEOUT_MS = 10_000;

const sleep = (msecs: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, msecs));

/** p's value, or timedOut when it does not settle within msecs. */
async function within<T, U>(p: Promise<T>, msecs: number, timedOut: U): Promise<T | U> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<U>((resolve) => { timer = setTimeout(() => resolve(timedOut), Math.max(0, msecs)); });
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

const TIMED_OUT: unique symbol = Symbol('timed out');

/**
 * Destroys conn's socket (node-postgres's Client): a query waiting on it
 * fails at once, and end() no longer waits for a server that does not
 * answer.
 */
function destroy(conn: KeeperConnection): void {
  const stream = (conn as { connection?: { stream?: { destroy?: () => void } } }).connection?.stream;
  try {
    stream?.destroy?.();
  } catch {
    // gone already
  }
}

/** Ends conn, destroying it when that takes over msecs. */
async function endWithin(conn: KeeperConnection, msecs: number): Promise<void> {
  if ((await within(conn.end().catch(() => {}), msecs, TIMED_OUT)) === TIMED_OUT) destroy(conn);
}

function number(name: string, v: unknown): void {
  if (typeof v !== 'number') throw new TypeError(`${name}: must be a number of milliseconds, got ${typeof v} ${String(v)}`);
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
  /** How long the lease is trusted from lastOk: TTL − margin, or less for a lease given with a shorter TTL, until it is renewed. */
  private window: bigint;
  private readonly releaseTimeoutMs: number;

  private broken = false;
  /** release or close ran: a connection opened after that is not kept. */
  private ended = false;

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
    this.window = this.ttl - this.margin;
    // A lease granted with a shorter TTL than the Keeper's (acquired
    // elsewhere) expires sooner in the database: until its first renewal it
    // is trusted, and renewed, on its own TTL's scale.
    if (lease.ttlMs !== undefined && lease.ttlMs < opts.ttlMs) {
      this.window = (this.window * ms(lease.ttlMs)) / this.ttl;
    }
    this.releaseTimeoutMs = opts.releaseTimeoutMs ?? DEFAULT_RELEASE_TIMEOUT_MS;
  }

  /** Acquires a lease (a new epoch; or keeps options.lease) and starts keeping it. */
  static async hold(options: KeeperOptions): Promise<Keeper> {
    const ttlMs = options.ttlMs;
    number('ttlMs', ttlMs);
    if (options.renewEveryMs !== undefined) number('renewEveryMs', options.renewEveryMs);
    if (options.marginMs !== undefined) number('marginMs', options.marginMs);
    if (options.releaseTimeoutMs !== undefined) {
      number('releaseTimeoutMs', options.releaseTimeoutMs);
      if (!(options.releaseTimeoutMs > 0)) throw new RangeError(`releaseTimeoutMs: must be positive, got ${options.releaseTimeoutMs}`);
    }
    if (options.lease !== undefined && !(typeof options.lease.ttlMs === 'number' && options.lease.ttlMs > 0)) {
      throw new TypeError('lease: its ttlMs is unknown: give the Lease that acquire returned (the Keeper trusts a lease no longer than it was granted for)');
    }
    const renewEveryMs = options.renewEveryMs ?? ttlMs / 3;
    const marginMs = options.marginMs ?? ttlMs / 10;
    if (!(ttlMs >= 10 && ttlMs <= 86_400_000)) throw new RangeError(`ttlMs: must be between 10ms and 24h, got ${ttlMs}`);
    if (!(marginMs >= 0 && marginMs < ttlMs)) throw new RangeError(`marginMs: must be at least 0 and below the ttl, got ${marginMs}`);
    if (!(renewEveryMs > 0 && renewEveryMs < ttlMs - marginMs)) {
      throw new RangeError(`renewEveryMs: must be positive and below ttl-margin (${ttlMs - marginMs}ms), got ${renewEveryMs}`);
    }
    const clock = options.clock ?? monotonicNs;
    const conn = await options.connect();
    // Listening before anything else: a connection lost while idle emits
    // 'error', which unheard ends the process.
    let k: Keeper | undefined;
    conn.on?.('error', () => k?.connectionLost(conn));
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
    const kept = new Keeper(conn, fg, { ...options, ttlMs, renewEveryMs, marginMs }, clock, lease, grantedAt!);
    k = kept;
    options.signal?.addEventListener('abort', () => void kept.stop(), { once: true });
    kept.armDeadline();
    kept.scheduleRenew((kept.renewEvery * kept.window) / (kept.ttl - kept.margin) - (clock() - kept.lastOk));
    return kept;
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
  trustedUntil(): bigint { return this.lastOk + this.window; }

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
    if (this.stopping) throw new LeaseLostError('the keeper was stopped', 'stopped');
    throw this.expired();
  }

  /**
   * Stops renewing and aborts the signal; a renewal in flight is cancelled
   * (its connection destroyed: the next call opens a new one). Does not
   * release. Idempotent. Takes at most releaseTimeoutMs.
   */
  async stop(): Promise<void> {
    if (!this.stopping) {
      this.stopping = true;
      clearTimeout(this.renewTimer);
      clearTimeout(this.deadlineTimer);
      if (!this.controller.signal.aborted) this.controller.abort(new Error('the keeper was stopped'));
    }
    const renewing = this.renewing;
    if (renewing !== undefined) {
      this.broken = true;
      destroy(this.conn);
      await within(renewing, this.releaseTimeoutMs, TIMED_OUT);
    }
  }

  /**
   * Stops, releases the lease unless it was lost (a lease taken over
   * meanwhile is nothing to release), and closes the Keeper's connection.
   * Takes at most releaseTimeoutMs: when the database does not answer by
   * then, the connection is destroyed and it throws (the lease expires
   * with its TTL).
   */
  async release(): Promise<void> {
    const started = performance.now();
    const left = () => this.releaseTimeoutMs - (performance.now() - started);
    await this.stop();
    try {
      if (this.lost === undefined) {
        const l = this.leaseNow;
        const done = await within(this.releaseNow(l), left(), TIMED_OUT);
        if (done === TIMED_OUT) {
          this.broken = true;
          destroy(this.conn);
          throw new Error(`fencegate: the release of the lease on ${JSON.stringify(l.resource)} (epoch ${l.epoch}) got no answer within ${this.releaseTimeoutMs}ms: it expires with its TTL`);
        }
      }
    } finally {
      this.ended = true;
      await endWithin(this.conn, Math.max(0, Math.min(1000, left())));
    }
  }

  /** Stops and closes the Keeper's connection, without releasing. Takes at most releaseTimeoutMs. */
  async close(): Promise<void> {
    const started = performance.now();
    await this.stop();
    this.ended = true;
    await endWithin(this.conn, Math.max(0, Math.min(1000, this.releaseTimeoutMs - (performance.now() - started))));
  }

  private async releaseNow(l: Lease): Promise<void> {
    if (this.broken) await this.reconnect(false);
    await this.fg.release(l.resource, l.holder, l.epoch).catch((e) => {
      if (!(e instanceof StaleEpochError)) throw e; // taken over meanwhile: nothing of ours
    });
  }

  // node-postgres does not reconnect a client: a new one, listened to.
  private async reconnect(forRenewal: boolean): Promise<void> {
    await endWithin(this.conn, 0);
    const conn = await this.opts.connect();
    conn.on?.('error', () => this.connectionLost(conn));
    if ((forRenewal && this.stopping) || this.ended) {
      // Stopped while connecting: the renewal is abandoned, and release
      // opens a connection of its own.
      await endWithin(conn, 0);
      throw new Error('the keeper was stopped');
    }
    this.conn = conn;
    this.fg = await Fencegate.attach(conn, { schema: this.fg.schema, checkVersion: false });
    this.broken = false;
  }

  /**
   * conn emitted 'error': it is gone. Not a loss of the lease, which the
   * database still holds: renew now, on a new connection, as after a failed
   * renewal (the lease is lost if none succeeds before the deadline).
   */
  private connectionLost(conn: KeeperConnection): void {
    if (conn !== this.conn) return;
    this.broken = true;
    if (this.lost || this.stopping || this.renewing !== undefined) return;
    clearTimeout(this.renewTimer);
    this.scheduleRenew(0n);
  }

  async [Symbol.asyncDispose](): Promise<void> { await this.release(); }

  private expired(): LeaseLostError {
    const s = (Number(this.window) / 1e9).toFixed(3);
    return new LeaseLostError(
      `lease on ${JSON.stringify(this.leaseNow.resource)} (epoch ${this.leaseNow.epoch}) can no longer be trusted: no successful renewal within ${s}s (its ttl less the margin) on the monotonic clock`,
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
      const r = this.renewOnce();
      this.renewing = r;
      const settled = () => { if (this.renewing === r) this.renewing = undefined; };
      r.then(settled, settled);
    }, wait);
  }

  private async renewOnce(): Promise<void> {
    const l = this.leaseNow;
    try {
      if (this.broken) await this.reconnect(true);
    } catch {
      this.scheduleRenew(ms(Math.min(this.opts.renewEveryMs, RETRY_MS)));
      return;
    }
    const started = this.clock();
    const left = Math.max(1, Math.floor(Number(this.trustedUntil() - started) / 1e6));
    const conn = this.conn;
    try {
      // A renewal that cannot answer before the deadline is of no use.
      await conn.query('BEGIN');
      await conn.query(`SELECT set_config('statement_timeout', $1, true)`, [`${left}ms`]);
      const expiresAt = await this.fg.renew(l.resource, l.holder, l.epoch, this.opts.ttlMs);
      await conn.query('COMMIT');
      if (this.lost === undefined) {
        this.leaseNow = { ...l, expiresAt, ttlMs: this.opts.ttlMs };
        this.lastOk = started;
        this.window = this.ttl - this.margin;
        this.renewCount++;
        if (!this.stopping) {
          clearTimeout(this.deadlineTimer);
          this.armDeadline();
        }
      }
      this.scheduleRenew(this.renewEvery);
    } catch (e) {
      if (!this.broken) await conn.query('ROLLBACK').catch(() => {});
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
    }
  }
}
