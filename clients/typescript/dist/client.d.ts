/** The version of the SQL interface this package speaks (docs/sql.md). */
export declare const INTERFACE_VERSION = 1;
/** fencegate's schema unless told otherwise (gateway migrate --schema). */
export declare const DEFAULT_SCHEMA = "fencegate";
/** What the calls need of a connection: a pg.Client or a pool's client. */
export interface Queryable {
    query(text: string, values?: unknown[]): Promise<{
        rows: any[];
    }>;
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
export declare function checkSchema(schema: string): string;
/**
 * fencegate's SQL interface on a node-postgres client. The calls run in the
 * client's current transaction: BEGIN, write your rows, enqueue, COMMIT; a
 * refusal aborts all of it. Make one with `await Fencegate.attach(client)`,
 * which checks the interface version.
 */
export declare class Fencegate {
    readonly db: Queryable;
    readonly schema: string;
    private constructor();
    /** A Fencegate on db; checks interface_version() unless checkVersion is false. */
    static attach(db: Queryable, options?: Options): Promise<Fencegate>;
    /**
     * `<schema>.interface_version()`; InterfaceVersionError when it cannot be
     * called. Call it (and attach) outside a transaction of yours: a failed
     * call aborts the transaction it runs in.
     */
    interfaceVersion(): Promise<number>;
    /**
     * Enqueues an intent in the client's transaction, fenced by epoch. A
     * value of the wrong type (an epoch of 1.5, a string with a lone
     * surrogate, a NaN in the payload) is refused before anything is sent:
     * InvalidInputError naming the field, as the database names a bad value.
     */
    enqueue(input: EnqueueInput): Promise<Enqueued>;
    /** A lease on resource: a new, higher epoch. Commit before using it. */
    acquire(resource: string, holder: string, ttlMs: number, opts?: {
        failoverEpochJump?: number;
    }): Promise<Lease>;
    /** Extends the lease by ttlMs from now, keeping its epoch; the new expiry. */
    renew(resource: string, holder: string, epoch: number, ttlMs: number): Promise<Date>;
    /** Frees the lease; the next acquire gets epoch + 1. */
    release(resource: string, holder: string, epoch: number): Promise<void>;
    private call;
}
