#!/usr/bin/env node
// A worker in Node.js that sends an invoice's email through fencegate.
//
// It writes its own row (the invoice) and fencegate's intent (the email) in
// ONE transaction, fenced by its lease's epoch, with fencegate's SQL
// interface (docs/sql.md). Either both commit or neither does; a worker whose
// lease was taken over is refused (SQLSTATE ZF002) and stores nothing.
//
//   GATEWAY_DATABASE_URL=postgres://… node worker.js acquire invoices worker-a 10000
//   GATEWAY_DATABASE_URL=postgres://… node worker.js send invoices 34 1001 alice@example.com
//
// Each command prints one JSON object. It needs node-postgres (npm ci here).
// $GATEWAY_SCHEMA names fencegate's schema (default fencegate).
// examples/sql-worker/sql_worker_test.go runs it.
'use strict';

const { Client } = require('pg');

// A schema name is a plain lower-case identifier (fencegate refuses others),
// so it can be written into the statement.
const schema = process.env.GATEWAY_SCHEMA || 'fencegate';
if (!/^[a-z_][a-z0-9_]*$/.test(schema)) throw new Error(`bad GATEWAY_SCHEMA ${schema}`);

// A lease on resource: every grant is a new, higher epoch.
async function acquire(db, resource, holder, ttlMs) {
  await db.query('BEGIN');
  try {
    const { rows } = await db.query(
      `SELECT epoch::text, expires_at FROM ${schema}.acquire($1, $2, $3 * interval '1 millisecond')`,
      [resource, holder, ttlMs]);
    await db.query('COMMIT');
    return { epoch: Number(rows[0].epoch), expires_at: rows[0].expires_at.toISOString() };
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

// Record the invoice and enqueue its email, in one transaction. Safe to run
// again after a lost response: the invoice insert does nothing the second
// time, and enqueue answers 'duplicate' with the same intent.
async function send(db, resource, epoch, invoiceId, email, rollback) {
  await db.query('BEGIN');
  try {
    await db.query('INSERT INTO invoices (id, email) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING', [invoiceId, email]);
    const { rows } = await db.query(
      `SELECT outcome, intent_id::text, status, current_epoch::text FROM ${schema}.enqueue(
         resource => $1, epoch => $2, operation_id => $3, kind => 'email', payload => $4::jsonb)`,
      [resource, epoch, `invoice-${invoiceId}`, JSON.stringify({
        to: email,
        from: 'billing@example.com',
        subject: `Invoice ${invoiceId}`,
        text: `Your invoice ${invoiceId} is ready.`,
      })]);
    // Anything that fails after the enqueue: the intent goes with the invoice.
    await db.query(rollback ? 'ROLLBACK' : 'COMMIT');
    const r = rows[0];
    return {
      outcome: r.outcome, intent_id: Number(r.intent_id), status: r.status,
      current_epoch: Number(r.current_epoch), rolled_back: rollback,
    };
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

async function main(argv) {
  const db = new Client({ connectionString: process.env.GATEWAY_DATABASE_URL });
  await db.connect();
  let out;
  try {
    if (argv[0] === 'acquire') {
      out = await acquire(db, argv[1], argv[2], Number(argv[3]));
    } else if (argv[0] === 'send' || argv[0] === 'send-rollback') {
      out = await send(db, argv[1], argv[2], Number(argv[3]), argv[4], argv[0] === 'send-rollback');
    } else {
      throw new Error(`unknown command ${argv[0]}`);
    }
  } catch (e) {
    // fencegate's refusals: ZF002 stale epoch, ZF003 conflict, ZF004
    // invalid input (the column names the field), ZF005 lease held; the
    // detail is JSON.
    if (!(e.code || '').startsWith('ZF')) throw e;
    out = { sqlstate: e.code, message: e.message, field: e.column || null, detail: JSON.parse(e.detail || '{}') };
  } finally {
    await db.end();
  }
  console.log(JSON.stringify(out));
}

main(process.argv.slice(2)).catch((e) => {
  console.error(e);
  process.exit(1);
});
