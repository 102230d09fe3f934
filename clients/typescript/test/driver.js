#!/usr/bin/env node
// The integration tests' worker: fencegate's TypeScript client as a program.
//
// clients/clients_test.go copies it into a project where the package is
// installed the way a user installs it (npm install pg ./clients/typescript)
// and runs it against the test run's PostgreSQL ($GATEWAY_DATABASE_URL,
// schema $GATEWAY_SCHEMA). Every command prints JSON objects, one a line; a
// refusal of fencegate's is printed with its error's class and typed fields.
//
//   driver.js version
//   driver.js acquire RESOURCE HOLDER TTL_MS
//   driver.js renew RESOURCE HOLDER EPOCH TTL_MS
//   driver.js release RESOURCE HOLDER EPOCH
//   driver.js send RESOURCE EPOCH NOTE_ID OPERATION_ID PAYLOAD_JSON
//   driver.js hold RESOURCE HOLDER TTL_MS
//   driver.js keeper RESOURCE HOLDER TTL_MS
//   driver.js badargs RESOURCE EPOCH
//
// send writes a row of its own (table client_notes, made by the test) and
// enqueues an email in one transaction. hold keeps a lease with a Keeper,
// prints {"event": "held"}, and on each line "check" on its standard input
// reports what its Keeper says, then tries a write with the Keeper's epoch.
//
// keeper holds a lease with a Keeper whose connections ($KEEPER_DATABASE_URL,
// else $GATEWAY_DATABASE_URL) carry application_name fencegate-keeper and,
// as a plain `new pg.Client`, no 'error' listener of their own; it prints
// {"event": "held"} and reads lines: "check" reports what the Keeper says,
// "release" releases (reporting how long it took and any error) and ends.
//
// badargs makes calls with arguments of the wrong type and reports each
// error.
'use strict';

const readline = require('node:readline');
const pg = require('pg');
const fencegate = require('@fencegate/client');

const url = process.env.GATEWAY_DATABASE_URL;
const schema = process.env.GATEWAY_SCHEMA || 'fencegate';

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');

// The typed error, as the test checks it: its class and the properties of
// that class (read from the error, not from the DETAIL).
function errorJSON(e) {
  const o = { error: e.constructor.name, sqlstate: e.sqlstate ?? null, message: e.message };
  if (e instanceof fencegate.StaleEpochError) {
    Object.assign(o, { resource: e.resource, supplied_epoch: e.suppliedEpoch, current_epoch: e.currentEpoch, reason: e.reason ?? null });
  } else if (e instanceof fencegate.ConflictError) {
    Object.assign(o, { resource: e.resource, operation_id: e.operationId, intent_id: e.intentId });
  } else if (e instanceof fencegate.InvalidInputError) {
    Object.assign(o, { field: e.field });
  } else if (e instanceof fencegate.LeaseHeldError) {
    Object.assign(o, { resource: e.resource, holder: e.holder, current_epoch: e.currentEpoch, expires_at: e.expiresAt?.toISOString() ?? null });
  } else if (e instanceof fencegate.NoPrincipalError) {
    Object.assign(o, { role: e.role, field: e.field });
  } else if (e instanceof fencegate.ForbiddenError) {
    Object.assign(o, { field: e.field, principal: e.principal, resource: e.resource });
  } else if (e instanceof fencegate.InterfaceVersionError) {
    Object.assign(o, { schema: e.schema, wanted: e.wanted, found: e.found ?? null });
  }
  o.is_fencegate_error = e instanceof fencegate.FencegateError;
  o.cause_is_pg = e.cause instanceof Error && typeof e.cause.code === 'string';
  return o;
}

const isRefusal = (e) => e instanceof fencegate.FencegateError || e instanceof fencegate.InterfaceVersionError;

async function connect() {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  return client;
}

// A business row and its intent, in one transaction.
async function send(fg, resource, epoch, noteId, operationId, payload) {
  const db = fg.db;
  await db.query('BEGIN');
  try {
    await db.query('INSERT INTO client_notes (id, body) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING', [noteId, `note ${noteId}`]);
    const r = await fg.enqueue({ resource, epoch, operationId, kind: 'email', payload });
    await db.query('COMMIT');
    return { outcome: r.outcome, intent_id: r.intentId, status: r.status, current_epoch: r.currentEpoch };
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

const notePayload = (id) => ({ to: 'alice@example.com', from: 'notes@example.com', subject: `note ${id}`, text: 'written' });

async function hold(resource, holder, ttlMs) {
  const db = await connect();
  const fg = await fencegate.Fencegate.attach(db, { schema });
  const keeper = await fencegate.Keeper.hold({ connect, resource, holder, ttlMs, schema });
  out({ event: 'held', epoch: keeper.epoch, pid: process.pid, wall: Date.now() / 1000 });
  let n = 0;
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (line.trim() !== 'check') continue;
    // Read at once: the Keeper's own verdict after the pause, not one it
    // learnt from a renewal.
    const valid = keeper.stillValid();
    const wall = Date.now() / 1000;
    // The timers' verdict (the AbortSignal): aborted within moments of the
    // resumption.
    if (!keeper.signal.aborted) {
      await new Promise((resolve) => {
        const t = setTimeout(resolve, 5000);
        keeper.signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
      });
    }
    n++;
    const reason = keeper.signal.reason;
    const report = {
      event: 'checked', still_valid: valid, cancelled: keeper.signal.aborted,
      reason: reason instanceof fencegate.LeaseLostError ? reason.reason : null,
      wall, renewals: keeper.renewals,
    };
    // The write a worker paused right after its check would make: the fence
    // refuses it, whatever the Keeper says.
    try {
      report.write = await send(fg, resource, keeper.epoch, 900 + n, `late-${n}`, notePayload(900 + n));
    } catch (e) {
      if (!isRefusal(e)) throw e;
      report.write = errorJSON(e);
    }
    out(report);
  }
  await keeper.release();
  await db.end();
}

// The Keeper's connections: no 'error' listener, as a user's plain helper.
async function connectKeeper() {
  const client = new pg.Client({ connectionString: process.env.KEEPER_DATABASE_URL || url, application_name: 'fencegate-keeper' });
  await client.connect();
  return client;
}

async function keeperLines(resource, holder, ttlMs) {
  const keeper = await fencegate.Keeper.hold({ connect: connectKeeper, resource, holder, ttlMs, schema });
  out({ event: 'held', epoch: keeper.epoch });
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const cmd = line.trim();
    if (cmd === 'check') {
      const reason = keeper.signal.reason;
      out({ event: 'checked', still_valid: keeper.stillValid(), renewals: keeper.renewals, epoch: keeper.epoch,
        reason: reason instanceof fencegate.LeaseLostError ? reason.reason : null });
    } else if (cmd === 'release') {
      const start = performance.now();
      const o = { event: 'released', ok: true };
      try {
        await keeper.release();
      } catch (e) {
        o.ok = false;
        o.error = `${e.name}: ${e.message}`;
      }
      o.seconds = (performance.now() - start) / 1000;
      out(o);
      rl.close();
      return;
    }
  }
  await keeper.close();
}

// Each call with one argument of the wrong type (clients_test.go's badArgs
// names the same cases for every language): its error.
async function badArgs(fg, resource, epoch) {
  const p = notePayload(1);
  const enq = (o) => fg.enqueue({ resource, epoch, operationId: 'op', kind: 'email', payload: p, ...o });
  const cases = {
    'enqueue epoch 1.5': () => enq({ epoch: 1.5 }),
    'enqueue epoch true': () => enq({ epoch: true }),
    'enqueue epoch 2^64': () => enq({ epoch: 2 ** 64 }),
    'enqueue epoch NaN': () => enq({ epoch: NaN }),
    "enqueue epoch '1'": () => enq({ epoch: String(epoch) }),
    'enqueue resource 5': () => enq({ resource: 5 }),
    'enqueue operation_id 5': () => enq({ operationId: 5 }),
    'enqueue kind 5': () => enq({ kind: 5 }),
    'enqueue key 5': () => enq({ key: 5 }),
    'enqueue fence true': () => enq({ fence: true }),
    'enqueue operation_id lone surrogate': () => enq({ operationId: 'a\ud800' }),
    'enqueue resource lone surrogate': () => enq({ resource: 'r\udc00' }),
    'enqueue payload lone surrogate': () => enq({ payload: { ...p, text: 'a\ud800b' } }),
    'enqueue payload NaN': () => enq({ payload: { ...p, to: ['a@example.com', NaN] } }),
    'acquire ttl missing': () => fg.acquire(resource, 'w', undefined),
    "acquire ttl '10s'": () => fg.acquire(resource, 'w', '10s'),
    'acquire ttl NaN': () => fg.acquire(resource, 'w', NaN),
    'acquire ttl Infinity': () => fg.acquire(resource, 'w', Infinity),
    'acquire holder 5': () => fg.acquire(resource, 5, 60000),
    'acquire failover_epoch_jump 1.5': () => fg.acquire(resource, 'w', 60000, { failoverEpochJump: 1.5 }),
    'renew epoch 1.5': () => fg.renew(resource, 'w', 1.5, 60000),
    "renew ttl '10s'": () => fg.renew(resource, 'w', epoch, '10s'),
    'release epoch true': () => fg.release(resource, 'w', true),
  };
  const o = {};
  for (const [name, call] of Object.entries(cases)) {
    try {
      await call();
      o[name] = { error: null };
    } catch (e) {
      o[name] = { error: e.constructor.name, field: e.field ?? null, message: e.message };
    }
  }
  return { cases: o };
}

async function main(argv) {
  const [cmd, ...a] = argv;
  if (cmd === 'hold') return hold(a[0], a[1], Number(a[2]));
  if (cmd === 'keeper') return keeperLines(a[0], a[1], Number(a[2]));
  const db = await connect();
  let o;
  try {
    const fg = await fencegate.Fencegate.attach(db, { schema });
    switch (cmd) {
      case 'version':
        o = { interface_version: await fg.interfaceVersion(), schema: fg.schema };
        break;
      case 'acquire': {
        const l = await fg.acquire(a[0], a[1], Number(a[2]));
        o = { epoch: l.epoch, expires_at: l.expiresAt.toISOString() };
        break;
      }
      case 'renew':
        o = { expires_at: (await fg.renew(a[0], a[1], Number(a[2]), Number(a[3]))).toISOString() };
        break;
      case 'release':
        await fg.release(a[0], a[1], Number(a[2]));
        o = { released: true };
        break;
      case 'send':
        o = await send(fg, a[0], Number(a[1]), Number(a[2]), a[3], JSON.parse(a[4]));
        break;
      case 'badargs':
        o = await badArgs(fg, a[0], Number(a[1]));
        break;
      default:
        throw new Error(`unknown command ${cmd}`);
    }
  } catch (e) {
    if (!isRefusal(e)) throw e;
    o = errorJSON(e);
  } finally {
    await db.end();
  }
  out(o);
}

main(process.argv.slice(2)).catch((e) => {
  console.error(e);
  process.exit(1);
});
