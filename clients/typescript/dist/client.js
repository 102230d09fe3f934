"use strict";
// The SQL interface's calls, on the caller's own node-postgres client, in
// whatever transaction that client is in: the caller's business rows and
// fencegate's intent commit together or not at all.
Object.defineProperty(exports, "__esModule", { value: true });
exports.Fencegate = exports.DEFAULT_SCHEMA = exports.INTERFACE_VERSION = void 0;
exports.checkSchema = checkSchema;
const errors_1 = require("./errors");
/** The version of the SQL interface this package speaks (docs/sql.md). */
exports.INTERFACE_VERSION = 1;
/** fencegate's schema unless told otherwise (gateway migrate --schema). */
exports.DEFAULT_SCHEMA = 'fencegate';
/** schema, if it is a name fencegate accepts; else throws naming `schema`. */
function checkSchema(schema) {
    if (typeof schema !== 'string' || !/^[a-z_][a-z0-9_]*$/.test(schema) || schema.length > 40) {
        throw new TypeError(`schema: must be a lower-case identifier of at most 40 bytes, got ${JSON.stringify(schema)}`);
    }
    return schema;
}
// A bigint column as text, read back as a number: fencegate's epochs and ids
// stay below 2^53.
const n = (v) => Number(v);
/**
 * fencegate's SQL interface on a node-postgres client. The calls run in the
 * client's current transaction: BEGIN, write your rows, enqueue, COMMIT; a
 * refusal aborts all of it. Make one with `await Fencegate.attach(client)`,
 * which checks the interface version.
 */
class Fencegate {
    db;
    schema;
    constructor(db, schema) {
        this.db = db;
        // A plain identifier (checked), so it can be written into statements.
        this.schema = checkSchema(schema);
    }
    /** A Fencegate on db; checks interface_version() unless checkVersion is false. */
    static async attach(db, options = {}) {
        const fg = new Fencegate(db, options.schema ?? exports.DEFAULT_SCHEMA);
        if (options.checkVersion !== false) {
            const found = await fg.interfaceVersion();
            if (found !== exports.INTERFACE_VERSION) {
                throw new errors_1.InterfaceVersionError(`${fg.schema}.interface_version() is ${found}, but this package speaks version ${exports.INTERFACE_VERSION}: use the client of that version`, fg.schema, exports.INTERFACE_VERSION, found);
            }
        }
        return fg;
    }
    /**
     * `<schema>.interface_version()`; InterfaceVersionError when it cannot be
     * called. Call it (and attach) outside a transaction of yours: a failed
     * call aborts the transaction it runs in.
     */
    async interfaceVersion() {
        try {
            const { rows } = await this.db.query(`SELECT ${this.schema}.interface_version() AS v`);
            return Number(rows[0].v);
        }
        catch (e) {
            throw new errors_1.InterfaceVersionError(`${this.schema}.interface_version() cannot be called (${e.message}): is fencegate installed in schema ${JSON.stringify(this.schema)} (gateway migrate --schema), and is this role granted USAGE on it?`, this.schema, exports.INTERFACE_VERSION, undefined, { cause: e });
        }
    }
    /** Enqueues an intent in the client's transaction, fenced by epoch. */
    async enqueue(input) {
        const { rows } = await this.call(`SELECT outcome, intent_id::text, status, current_epoch::text FROM ${this.schema}.enqueue(
         resource => $1, epoch => $2, operation_id => $3, kind => $4, payload => $5::jsonb, key => $6, fence => $7)`, [input.resource, input.epoch, input.operationId, input.kind, JSON.stringify(input.payload ?? null),
            input.key ?? null, input.fence ?? null]);
        const r = rows[0];
        return { outcome: r.outcome, intentId: n(r.intent_id), status: r.status, currentEpoch: n(r.current_epoch) };
    }
    /** A lease on resource: a new, higher epoch. Commit before using it. */
    async acquire(resource, holder, ttlMs, opts = {}) {
        const jump = opts.failoverEpochJump === undefined ? '' : ', failover_epoch_jump => $4';
        const args = [resource, holder, ttlMs];
        if (opts.failoverEpochJump !== undefined)
            args.push(opts.failoverEpochJump);
        const { rows } = await this.call(`SELECT epoch::text, expires_at FROM ${this.schema}.acquire(resource => $1, holder => $2,
         ttl => $3::float8 * interval '1 millisecond'${jump})`, args);
        return { resource, holder, epoch: n(rows[0].epoch), expiresAt: rows[0].expires_at };
    }
    /** Extends the lease by ttlMs from now, keeping its epoch; the new expiry. */
    async renew(resource, holder, epoch, ttlMs) {
        const { rows } = await this.call(`SELECT ${this.schema}.renew(resource => $1, holder => $2, epoch => $3,
         ttl => $4::float8 * interval '1 millisecond') AS expires_at`, [resource, holder, epoch, ttlMs]);
        return rows[0].expires_at;
    }
    /** Frees the lease; the next acquire gets epoch + 1. */
    async release(resource, holder, epoch) {
        await this.call(`SELECT ${this.schema}.release(resource => $1, holder => $2, epoch => $3)`, [resource, holder, epoch]);
    }
    async call(text, values) {
        try {
            return await this.db.query(text, values);
        }
        catch (e) {
            throw (0, errors_1.typed)(e);
        }
    }
}
exports.Fencegate = Fencegate;
