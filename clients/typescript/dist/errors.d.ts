/** The DETAIL object of a refusal. */
export type Detail = Record<string, unknown>;
/** A refusal of fencegate's SQL interface (SQLSTATE class ZF). */
export declare class FencegateError extends Error {
    /** The SQLSTATE: ZF002, … */
    readonly sqlstate: string;
    /** The DETAIL's code: stale_epoch, conflict, … */
    readonly code: string | undefined;
    /** The whole DETAIL object. */
    readonly detail: Detail;
    /** The error's COLUMN: the field it names, if any. */
    readonly column: string | undefined;
    constructor(message: string, sqlstate: string, detail?: Detail, column?: string, options?: {
        cause?: unknown;
    });
}
/** ZF001: the database is not the epoch authority on record; nothing was granted. */
export declare class AuthorityChangedError extends FencegateError {
}
/**
 * ZF002: the epoch is not the resource's current one: authority moved on (a
 * takeover), and nothing of the transaction may commit. `reason` is set for
 * renew and release.
 */
export declare class StaleEpochError extends FencegateError {
    readonly resource: string | undefined;
    readonly suppliedEpoch: number | undefined;
    readonly currentEpoch: number | undefined;
    readonly reason: string | undefined;
}
/** ZF003: the operation id was committed before with different content. */
export declare class ConflictError extends FencegateError {
    readonly resource: string | undefined;
    readonly operationId: string | undefined;
    readonly intentId: number | undefined;
}
/** ZF004: a missing or invalid argument or payload field; nothing was stored. */
export declare class InvalidInputError extends FencegateError {
    readonly field: string | undefined;
}
/** ZF005: acquire while another holder's lease is live. */
export declare class LeaseHeldError extends FencegateError {
    readonly resource: string | undefined;
    readonly holder: string | undefined;
    readonly currentEpoch: number | undefined;
    /** When the holder's lease expires unless renewed, by PostgreSQL's clock (a lease's expiresAt is a Date too); undefined if absent. */
    readonly expiresAt: Date | undefined;
}
/** ZF006: a rule set is in force and the calling role is mapped to no principal. */
export declare class NoPrincipalError extends FencegateError {
    readonly role: string | undefined;
    readonly field: string | undefined;
}
/** ZF007: the role's principal may not do this; `field` names what. */
export declare class ForbiddenError extends FencegateError {
    readonly field: string | undefined;
    readonly principal: string | undefined;
    readonly resource: string | undefined;
    readonly kind: string | undefined;
}
/**
 * The database does not offer the SQL interface this package speaks:
 * fencegate is not installed in the schema, the role may not use it, or its
 * interface_version() is another one (`found`; undefined when there is none).
 */
export declare class InterfaceVersionError extends Error {
    readonly schema: string;
    readonly wanted: number;
    readonly found: number | undefined;
    constructor(message: string, schema: string, wanted: number, found: number | undefined, options?: {
        cause?: unknown;
    });
}
/**
 * A Keeper's lease can no longer be trusted: `reason` is `expired` (no
 * renewal succeeded within TTL − margin on the monotonic clock),
 * `stale_epoch` (a renewal was refused; `cause` is the StaleEpochError) or
 * `stopped` (check() after stop(); the Python client raises LeaseLost too).
 */
export declare class LeaseLostError extends Error {
    readonly reason: 'expired' | 'stale_epoch' | 'stopped';
    constructor(message: string, reason: 'expired' | 'stale_epoch' | 'stopped', options?: {
        cause?: unknown;
    });
}
/**
 * The typed error for node-postgres's error err, or undefined when err is
 * not a refusal of fencegate's. For statements of your own that call the
 * interface.
 */
export declare function fromPgError(err: unknown): FencegateError | undefined;
/** err, typed when it is fencegate's refusal. */
export declare function typed(err: unknown): unknown;
