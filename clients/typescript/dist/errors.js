"use strict";
// fencegate's refusals as typed errors. The SQL interface refuses with
// SQLSTATEs of class ZF, a JSON object in the error's DETAIL and the field
// in its COLUMN (docs/sql.md, "Errors"). Every call of this package throws
// the matching subclass of FencegateError, with the DETAIL's fields as
// properties and node-postgres's error as `cause`. The caller's transaction
// is aborted either way (PostgreSQL's rule): roll it back, then retry or
// give up.
Object.defineProperty(exports, "__esModule", { value: true });
exports.LeaseLostError = exports.InterfaceVersionError = exports.ForbiddenError = exports.NoPrincipalError = exports.LeaseHeldError = exports.InvalidInputError = exports.ConflictError = exports.StaleEpochError = exports.AuthorityChangedError = exports.FencegateError = void 0;
exports.fromPgError = fromPgError;
exports.typed = typed;
/** A refusal of fencegate's SQL interface (SQLSTATE class ZF). */
class FencegateError extends Error {
    /** The SQLSTATE: ZF002, … */
    sqlstate;
    /** The DETAIL's code: stale_epoch, conflict, … */
    code;
    /** The whole DETAIL object. */
    detail;
    /** The error's COLUMN: the field it names, if any. */
    column;
    constructor(message, sqlstate, detail = {}, column, options) {
        super(message, options);
        this.name = new.target.name;
        this.sqlstate = sqlstate;
        this.detail = detail;
        this.code = typeof detail.code === 'string' ? detail.code : undefined;
        this.column = column;
    }
}
exports.FencegateError = FencegateError;
const str = (v) => (typeof v === 'string' ? v : undefined);
// Epochs and intent ids are at most 2^53 (fencegate's ceiling): a number
// holds them exactly.
const num = (v) => (typeof v === 'number' ? v : undefined);
// A Date of an ISO 8601 timestamp as PostgreSQL's JSON writes it; undefined if v is none.
const date = (v) => {
    if (typeof v !== 'string' || !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d(:?\d\d)?)$/.test(v)) {
        return undefined;
    }
    // Date.parse wants the offset as +hh:mm.
    const d = new Date(v.replace(/([+-]\d\d)(\d\d)?$/, (_, h, m) => `${h}:${m ?? '00'}`));
    return Number.isNaN(d.getTime()) ? undefined : d;
};
/** ZF001: the database is not the epoch authority on record; nothing was granted. */
class AuthorityChangedError extends FencegateError {
}
exports.AuthorityChangedError = AuthorityChangedError;
/**
 * ZF002: the epoch is not the resource's current one: authority moved on (a
 * takeover), and nothing of the transaction may commit. `reason` is set for
 * renew and release.
 */
class StaleEpochError extends FencegateError {
    resource = str(this.detail.resource);
    suppliedEpoch = num(this.detail.supplied_epoch);
    currentEpoch = num(this.detail.current_epoch);
    reason = str(this.detail.reason);
}
exports.StaleEpochError = StaleEpochError;
/** ZF003: the operation id was committed before with different content. */
class ConflictError extends FencegateError {
    resource = str(this.detail.resource);
    operationId = str(this.detail.operation_id);
    intentId = num(this.detail.intent_id);
}
exports.ConflictError = ConflictError;
/** ZF004: a missing or invalid argument or payload field; nothing was stored. */
class InvalidInputError extends FencegateError {
    field = str(this.detail.field) ?? this.column;
}
exports.InvalidInputError = InvalidInputError;
/** ZF005: acquire while another holder's lease is live. */
class LeaseHeldError extends FencegateError {
    resource = str(this.detail.resource);
    holder = str(this.detail.holder);
    currentEpoch = num(this.detail.current_epoch);
    /** When the holder's lease expires unless renewed, by PostgreSQL's clock (a lease's expiresAt is a Date too); undefined if absent. */
    expiresAt = date(this.detail.expires_at);
}
exports.LeaseHeldError = LeaseHeldError;
/** ZF006: a rule set is in force and the calling role is mapped to no principal. */
class NoPrincipalError extends FencegateError {
    role = str(this.detail.role);
    field = str(this.detail.field) ?? this.column;
}
exports.NoPrincipalError = NoPrincipalError;
/** ZF007: the role's principal may not do this; `field` names what. */
class ForbiddenError extends FencegateError {
    field = str(this.detail.field) ?? this.column;
    principal = str(this.detail.principal);
    resource = str(this.detail.resource);
    kind = str(this.detail.kind);
}
exports.ForbiddenError = ForbiddenError;
/**
 * The database does not offer the SQL interface this package speaks:
 * fencegate is not installed in the schema, the role may not use it, or its
 * interface_version() is another one (`found`; undefined when there is none).
 */
class InterfaceVersionError extends Error {
    schema;
    wanted;
    found;
    constructor(message, schema, wanted, found, options) {
        super(message, options);
        this.schema = schema;
        this.wanted = wanted;
        this.found = found;
        this.name = 'InterfaceVersionError';
    }
}
exports.InterfaceVersionError = InterfaceVersionError;
/**
 * A Keeper's lease can no longer be trusted: `reason` is `expired` (no
 * renewal succeeded within TTL − margin on the monotonic clock),
 * `stale_epoch` (a renewal was refused; `cause` is the StaleEpochError) or
 * `stopped` (check() after stop(); the Python client raises LeaseLost too).
 */
class LeaseLostError extends Error {
    reason;
    constructor(message, reason, options) {
        super(message, options);
        this.reason = reason;
        this.name = 'LeaseLostError';
    }
}
exports.LeaseLostError = LeaseLostError;
const bySqlstate = {
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
function fromPgError(err) {
    const e = err;
    const code = e && typeof e === 'object' ? e.code : undefined;
    if (typeof code !== 'string' || !code.startsWith('ZF'))
        return undefined;
    let detail = {};
    try {
        const d = e.detail ? JSON.parse(e.detail) : {};
        if (d && typeof d === 'object' && !Array.isArray(d))
            detail = d;
    }
    catch {
        // not JSON: the typed fields stay undefined
    }
    const Cls = bySqlstate[code] ?? FencegateError;
    return new Cls(e.message ?? code, code, detail, e.column, { cause: err });
}
/** err, typed when it is fencegate's refusal. */
function typed(err) {
    return fromPgError(err) ?? err;
}
