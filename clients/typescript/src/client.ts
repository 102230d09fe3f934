// The SQL interface's calls, on the caller's own node-postgres client, in
// whatever transaction that client is in: the caller's business rows and
// fencegate's intent commit together or not at all.

import { typed, InterfaceVersionError, InvalidInputError } from './errors';

/** The version of the SQL interface this package speaks (docs/sql.md). */
export const INTERFACE_VERSION = 1;
/** fencegate's schema unless told otherwise (gateway migrate --schema). */
export const DEFAULT_SCHEMA = 'fencegate';

/** What the calls need of a connection: a pg.Client or a pool's client. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** What enqueue answered. */
export interface Enqueued {
  /** created: a new intent, relayed once your transaction commits; duplicate: the operation id was committed before with the same content (a retry after a lost response): the same intentId. */
  outcome: 'created' | 'duplicate';
  intentId: number;
  status: string;
  currentEpoch: number;
}

/** A lease as granted or renewed: pass `epoch` with every write. */
export interface Lease {
  resource: string;
  holder: string;
  epoch: number;
  /** PostgreSQL's clock: for people, never for deciding. */
  expiresAt: Date;
  /** The time to live it was granted with (set by acquire): a Keeper given this lease trusts it no longer. */
  ttlMs?: number;
}

export interface EnqueueInput {
  resource: string;
  epoch: number;
  operationId: string;
  kind: string;
  /** The kind's payload, a JSON-able object. */
  payload: unknown;
  key?: string;
  fence?: 'commit' | 'execute';
}

export interface Options {
  /** fencegate's schema (default fencegate): a lower-case identifier of at most 40 bytes. */
  schema?: string;
  /** Check interface_version() when attaching (default true). */
  checkVersion?: boolean;
}

/** schema, if it is a name fencegate accepts; else throws naming `schema`. */
export function checkSchema(schema: string): string {
  if (typeof schema !== 'string' || !/^[a-z_][a-z0-9_]*$/.test(schema) || schema.length > 40) {
    throw new TypeError(`schema: must be a lower-case identifier of at most 40 bytes, got ${JSON.stringify(schema)}`);
  }
  return schema;
}

// The arguments' checks, made before anything is sent: a value of the wrong
// type is refused as the database refuses a bad value, InvalidInputError
// (ZF004) naming the field (the SQL argument's name). node-postgres would
// send 1.5 or true as text the database cannot read as a bigint, and encode
// a lone surrogate as U+FFFD, so that two operation ids became one.

function invalid(field: string, why: string): InvalidInputError {
  return new InvalidInputError(`invalid input: ${field}: ${why}`, 'ZF004', { code: 'invalid_input', field }, field);
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function show(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'bigint') return `${v}n`;
  return String(v);
}

/** v as a text argument: a string without lone surrogates, or null/undefined (for the database to refuse naming it when it is required). */
function text(field: string, v: unknown): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== 'string') throw invalid(field, `must be a string, got ${typeof v} ${show(v)}`);
  const m = LONE_SURROGATE.exec(v);
  if (m) throw invalid(field, `a lone surrogate (U+${m[0].charCodeAt(0).toString(16).toUpperCase()}) at offset ${m.index} is not text`);
  return v;
}

/** v as a bigint argument: an integer number that a double holds exactly, or null/undefined. */
function integer(field: string, v: unknown): number | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) {
    throw invalid(field, `must be an integer below 2^53, got ${typeof v} ${show(v)}`);
  }
  return v;
}

/** v as a ttl in milliseconds: a finite number (its range is the database's to check, naming ttl). */
function ttl(v: unknown): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) {
    throw invalid('ttl', `must be a finite number of milliseconds, got ${v === undefined ? 'undefined' : `${typeof v} ${show(v)}`}`);
  }
  // Clamped to about 31 years either way, which the database refuses naming
  // ttl (past an interval's range it would fail as an overflow instead).
  return Math.max(-1e15, Math.min(1e15, v));
}

/**
 * Checks a payload before it is encoded: no lone surrogate in a string or a
 * name, and no number JSON cannot carry (NaN and ±Infinity, which
 * JSON.stringify writes as null), naming where (`payload.to[1]`).
 */
function checkPayload(v: unknown, path: string, seen: Set<object>): void {
  if (typeof v === 'string') {
    text(path, v);
  } else if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw invalid(path, `${v} is not a JSON number`);
  } else if (v !== null && typeof v === 'object') {
    if (seen.has(v)) return; // JSON.stringify refuses the cycle itself
    seen.add(v);
    const j = (v as { toJSON?: unknown }).toJSON;
    if (typeof j === 'function') {
      checkPayload(j.call(v, ''), path, seen);
    } else if (Array.isArray(v)) {
      v.forEach((e, i) => checkPayload(e, `${path}[${i}]`, seen));
    } else {
      for (const [k, e] of Object.entries(v)) {
        text(path, k);
        checkPayload(e, `${path}.${k}`, seen);
      }
    }
    seen.delete(v);
  }
}

// A bigint column as text, read back as a number: fencegate's epochs and ids
// stay below 2^53.
const n = (v: string): number => Number(v);

/**
 * fencegate's SQL interface on a node-postgres client. The calls run in the
 * client's current transaction: BEGIN, write your rows, enqueue, COMMIT; a
 * refusal aborts all of it. Make one with `await Fencegate.attach(client)`,
 * which checks the interface version.
 */
export class Fencegate {
  readonly schema: string;

  private constructor(
    readonly db: Queryable,
    schema: string,
  ) {
    // A plain identifier (checked), so it can be written into statements.
    this.schema = checkSchema(schema);
  }

  /** A Fencegate on db; checks interface_version() unless checkVersion is false. */
  static async attach(db: Queryable, options: Options = {}): Promise<Fencegate> {
    const fg = new Fencegate(db, options.schema ?? DEFAULT_SCHEMA);
    if (options.checkVersion !== false) {
      const found = await fg.interfaceVersion();
      if (found !== INTERFACE_VERSION) {
        throw new InterfaceVersionError(
          `${fg.schema}.interface_version() is ${found}, but this package speaks version ${INTERFACE_VERSION}: use the client of that version`,
          fg.schema, INTERFACE_VERSION, found);
      }
    }
    return fg;
  }

  /**
   * `<schema>.interface_version()`; InterfaceVersionError when it cannot be
   * called. Call it (and attach) outside a transaction of yours: a failed
   * call aborts the transaction it runs in.
   */
  async interfaceVersion(): Promise<number> {
    try {
      const { rows } = await this.db.query(`SELECT ${this.schema}.interface_version() AS v`);
      return Number(rows[0].v);
    } catch (e) {
      throw new InterfaceVersionError(
        `${this.schema}.interface_version() cannot be called (${(e as Error).message}): is fencegate installed in schema ${JSON.stringify(this.schema)} (gateway migrate --schema), and is this role granted USAGE on it?`,
        this.schema, INTERFACE_VERSION, undefined, { cause: e });
    }
  }

  /**
   * Enqueues an intent in the client's transaction, fenced by epoch. A
   * value of the wrong type (an epoch of 1.5, a string with a lone
   * surrogate, a NaN in the payload) is refused before anything is sent:
   * InvalidInputError naming the field, as the database names a bad value.
   */
  async enqueue(input: EnqueueInput): Promise<Enqueued> {
    const args = [text('resource', input.resource), integer('epoch', input.epoch), text('operation_id', input.operationId),
      text('kind', input.kind)];
    checkPayload(input.payload, 'payload', new Set());
    const { rows } = await this.call(
      `SELECT outcome, intent_id::text, status, current_epoch::text FROM ${this.schema}.enqueue(
         resource => $1, epoch => $2, operation_id => $3, kind => $4, payload => $5::jsonb, key => $6, fence => $7)`,
      [...args, JSON.stringify(input.payload ?? null), text('key', input.key), text('fence', input.fence)]);
    const r = rows[0];
    return { outcome: r.outcome, intentId: n(r.intent_id), status: r.status, currentEpoch: n(r.current_epoch) };
  }

  /** A lease on resource: a new, higher epoch. Commit before using it. */
  async acquire(resource: string, holder: string, ttlMs: number, opts: { failoverEpochJump?: number } = {}): Promise<Lease> {
    const jump = opts.failoverEpochJump === undefined ? '' : ', failover_epoch_jump => $4';
    const args: unknown[] = [text('resource', resource), text('holder', holder), ttl(ttlMs)];
    if (opts.failoverEpochJump !== undefined) args.push(integer('failover_epoch_jump', opts.failoverEpochJump));
    const { rows } = await this.call(
      `SELECT epoch::text, expires_at FROM ${this.schema}.acquire(resource => $1, holder => $2,
         ttl => $3::float8 * interval '1 millisecond'${jump})`, args);
    return { resource, holder, epoch: n(rows[0].epoch), expiresAt: rows[0].expires_at, ttlMs };
  }

  /** Extends the lease by ttlMs from now, keeping its epoch; the new expiry. */
  async renew(resource: string, holder: string, epoch: number, ttlMs: number): Promise<Date> {
    const args = [text('resource', resource), text('holder', holder), integer('epoch', epoch), ttl(ttlMs)];
    const { rows } = await this.call(
      `SELECT ${this.schema}.renew(resource => $1, holder => $2, epoch => $3,
         ttl => $4::float8 * interval '1 millisecond') AS expires_at`, args);
    return rows[0].expires_at;
  }

  /** Frees the lease; the next acquire gets epoch + 1. */
  async release(resource: string, holder: string, epoch: number): Promise<void> {
    const args = [text('resource', resource), text('holder', holder), integer('epoch', epoch)];
    await this.call(`SELECT ${this.schema}.release(resource => $1, holder => $2, epoch => $3)`, args);
  }

  private async call(text: string, values: unknown[]): Promise<{ rows: any[] }> {
    try {
      return await this.db.query(text, values);
    } catch (e) {
      throw typed(e);
    }
  }
}
