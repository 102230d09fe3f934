#!/usr/bin/env node
// A worker in Node.js that sends an invoice's email through fencegate.
//
// It writes its own row (the invoice) and fencegate's intent (the email) in
// ONE transaction, fenced by its lease's epoch, with fencegate's TypeScript
// client (clients/typescript, @fencegate/client). Either both commit or
// neither does; a worker whose lease was taken over is refused
// (StaleEpochError, SQLSTATE ZF002) and stores nothing.
//
//   GATEWAY_DATABASE_URL=postgres://… node worker.js acquire invoices worker-a 10000
//   GATEWAY_DATABASE_URL=postgres://… node worker.js send invoices 34 1001 alice@example.com
//
// Each command prints one JSON object. It needs node-postgres and the client
// (npm ci here). It creates its table (invoices) when missing.
// $GATEWAY_SCHEMA names fencegate's schema (default fencegate).
// examples/sql-worker/sql_worker_test.go runs it.
'use strict';

const { Client } = require('pg');
const { Fencegate, FencegateError } = require('@fencegate/client');

const schema = process.env.GATEWAY_SCHEMA || 'fencegate';

// A lease on resource: every grant is a new, higher epoch (committed
// before it is used: the client is in autocommit).
async function acquire(fg, resource, holder, ttlMs) {
  const lease = await fg.acquire(resource, holder, ttlMs);
  return { epoch: lease.epoch, expires_at: lease.expiresAt.toISOString() };
}

// Record the invoice and enqueue its email, in one transaction. Safe to run
// again after a lost response: the invoice insert does nothing the second
// time, and enqueue answers 'duplicate' with the same intent.
async function send(fg, resource, epoch, invoiceId, email, rollback) {
  const db = fg.db;
  await db.query('BEGIN');
  try {
    await db.query('INSERT INTO invoices (id, email) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING', [invoiceId, email]);
    const r = await fg.enqueue({
      resource, epoch, operationId: `invoice-${invoiceId}`, kind: 'email',
      payload: { to: email, from: 'billing@example.com', subject: `Invoice ${invoiceId}`, text: `Your invoice ${invoiceId} is ready.` },
    });
    // Anything that fails after the enqueue: the intent goes with the invoice.
    await db.query(rollback ? 'ROLLBACK' : 'COMMIT');
    return { outcome: r.outcome, intent_id: r.intentId, status: r.status, current_epoch: r.currentEpoch, rolled_back: rollback };
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

async function main(argv) {
  const db = new Client({ connectionString: process.env.GATEWAY_DATABASE_URL });
  // A lost connection emits 'error'; with no listener it ends the process.
  // Listened to, the next query on it fails instead.
  db.on('error', (e) => console.error('database connection lost:', e.message));
  await db.connect();
  let out;
  try {
    const fg = await Fencegate.attach(db, { schema }); // checks the SQL interface's version
    await db.query('CREATE TABLE IF NOT EXISTS invoices (id bigint PRIMARY KEY, email text NOT NULL)');
    if (argv[0] === 'acquire') {
      out = await acquire(fg, argv[1], argv[2], Number(argv[3]));
    } else if (argv[0] === 'send' || argv[0] === 'send-rollback') {
      out = await send(fg, argv[1], Number(argv[2]), Number(argv[3]), argv[4], argv[0] === 'send-rollback');
    } else {
      throw new Error(`unknown command ${argv[0]}`);
    }
  } catch (e) {
    // fencegate's refusals, typed: StaleEpochError (ZF002), ConflictError
    // (ZF003), InvalidInputError (ZF004, .field), LeaseHeldError (ZF005), …;
    // the DETAIL's fields are properties.
    if (!(e instanceof FencegateError)) throw e;
    out = { sqlstate: e.sqlstate, message: e.message, field: e.column ?? null, detail: e.detail };
  } finally {
    await db.end();
  }
  console.log(JSON.stringify(out));
}

main(process.argv.slice(2)).catch((e) => {
  console.error(e);
  process.exit(1);
});
