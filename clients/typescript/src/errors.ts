// fencegate's refusals as typed errors. The SQL interface refuses with
// SQLSTATEs of class ZF, a JSON object in the error's DETAIL and the field
// in its COLUMN (docs/sql.md, "Errors"). Every call of this package throws
// the matching subclass of FencegateError, with the DETAIL's fields as
// properties and node-postgres's error as `cause`. The caller's transaction
// is aborted either way (PostgreSQL's rule): roll it back, then retry or
// give up.

/** The DETAIL object of a refusal. */
export type Detail = Record<string, unknown>;

interface PgErrorLike {
  code?: string;
  message?: string;
  detail?: string;
  column?: string;
}

/** A refusal of fencegate's SQL interface (SQLSTATE class ZF). */
export class FencegateError extends Error {
  /** The SQLSTATE: ZF002, … */
  readonly sqlstate: string;
  /** The DETAIL's code: stale_epoch, conflict, … */
  readonly code: string | undefined;
  /** The whole DETAIL object. */
  readonly detail: Detail;
  /** The error's COLUMN: the field it names, if any. */
  readonly column: string | undefined;

  constructor(message: string, sqlstate: string, detail: Detail = {}, column?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.sqlstate = sqlstate;
    this.detail = detail;
    this.code = typeof detail.code === 'string' ? detail.code : undefined;
    this.column = column;
  }
}

const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);
// Epochs and intent ids are at most 2^53 (fencegate's ceiling): a number
// holds them exactly.
const num = (v: unknown): number | undefined => (typeof v === 'number' ? v : undefined);
// A Date of an ISO 8601 timestamp as PostgreSQL's JSON writes it; undefined if v is none.
const date = (v: unknown): Date | undefined => {
  if (typeof v !== 'string' || !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d(:?\d\d)?)$/.test(v)) {
    return undefined;
  }
  // Date.parse wants the offset as +hh:mm.
  const d = new Date(v.replace(/([+-]\d\d)(\d\d)?$/, (_, h: string, m?: string) => `${h}:${m ?? '00'}`));
  return Number.isNaN(d.getTime()) ? undefined : d;
};

/** ZF001: the database is not the epoch authority on record; nothing was granted. */
export class AuthorityChangedError extends FencegateError {}

/**
 * ZF002: the epoch is not the resource's current one: authority moved on (a
 * takeover), and nothing of the transaction may commit. `reason` is set for
 * renew and release.
 */
export class StaleEpochError extends FencegateError {
  readonly resource = str(this.detail.resource);
  readonly suppliedEpoch = num(this.detail.supplied_epoch);
  readonly currentEpoch = num(this.detail.current_epoch);
  readonly reason = str(this.detail.reason);
}

/** ZF003: the operation id was committed before with different content. */
export class ConflictError extends FencegateError {
  readonly resource = str(this.detail.resource);
  readonly operationId = str(this.detail.operation_id);
  readonly intentId = num(this.detail.intent_id);
}

/** ZF004: a missing or invalid argument or payload field; nothing was stored. */
export class InvalidInputError extends FencegateError {
  readonly field = str(this.detail.field) ?? this.column;
}

/** ZF005: acquire while another holder's lease is live. */
export class LeaseHeldError extends FencegateError {
  readonly resource = str(this.detail.resource);
  readonly holder = str(this.detail.holder);
  readonly currentEpoch = num(this.detail.current_epoch);
  /** When the holder's lease expires unless renewed, by PostgreSQL's clock (a lease's expiresAt is a Date too); undefined if absent. */
  readonly expiresAt = date(this.detail.expires_at);
}

/** ZF006: a rule set is in force and the calling role is mapped to no principal. */
export class NoPrincipalError extends FencegateError {
  readonly role = str(this.detail.role);
  readonly field = str(this.detail.field) ?? this.column;
}

/** ZF007: the role's principal may not do this; `field` names what. */
export class ForbiddenError extends FencegateError {
  readonly field = str(this.detail.field) ?? this.column;
  readonly principal = str(this.detail.principal);
  readonly resource = str(this.detail.resource);
  readonly kind = str(this.detail.kind);
}

/**
 * The database does not offer the SQL interface this package speaks:
 * fencegate is not installed in the schema, the role may not use it, or its
 * interface_version() is another one (`found`; undefined when there is none).
 */
export class InterfaceVersionError extends Error {
  constructor(
    message: string,
    readonly schema: string,
    readonly wanted: number,
    readonly found: number | undefined,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'InterfaceVersionError';
  }
}

/**
 * A Keeper's lease can no longer be trusted: `reason` is `expired` (no
 * renewal succeeded within TTL − margin on the monotonic clock),
 * `stale_epoch` (a renewal was refused; `cause` is the StaleEpochError) or
 * `stopped` (check() after stop(); the Python client raises LeaseLost too).
 */
export class LeaseLostError extends Error {
  constructor(
    message: string,
    readonly reason: 'expired' | 'stale_epoch' | 'stopped',
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'LeaseLostError';
  }
}

const bySqlstate: Record<string, typeof FencegateError> = {
  ZF001: AuthorityChangedError,
  ZF002: StaleEpochError,
  ZF003: ConflictError,
  ZF004: InvalidInputError,
  ZF005: LeaseHeldError,
  ZF006: NoPrincipalError,
  ZF007: ForbiddenError,
};

/**
 * The typed error for node-postgres's error err, or undefined when err is
 * not a refusal of fencegate's. For statements of your own that call the
 * interface.
 */
export function fromPgError(err: unknown): FencegateError | undefined {
  const e = err as PgErrorLike | null;
  const code = e && typeof e === 'object' ? e.code : undefined;
  if (typeof code !== 'string' || !code.startsWith('ZF')) return undefined;
  let detail: Detail = {};
  try {
    const d: unknown = e!.detail ? JSON.parse(e!.detail) : {};
    if (d && typeof d === 'object' && !Array.isArray(d)) detail = d as Detail;
  } catch {
    // not JSON: the typed fields stay undefined
  }
  const Cls = bySqlstate[code] ?? FencegateError;
  return new Cls(e!.message ?? code, code, detail, e!.column, { cause: err });
}

/** err, typed when it is fencegate's refusal. */
export function typed(err: unknown): unknown {
  return fromPgError(err) ?? err;
}
