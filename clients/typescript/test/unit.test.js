// Unit tests of @fencegate/client that need no database: the typed errors
// made from node-postgres's, and the Keeper's trust judged on the clock it
// is given, with a stand-in connection. clients/clients_test.go runs them
// (node --test) against dist/; the database tests are there.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fg = require('../dist');

const pgError = (code, detail, column) =>
  Object.assign(new Error('refused'), { code, detail: JSON.stringify(detail), column });

test('each SQLSTATE is its typed error, with the DETAIL fields', () => {
  const cases = [
    ['ZF002', { code: 'stale_epoch', resource: 'r', supplied_epoch: 3, current_epoch: 5 }, undefined, fg.StaleEpochError,
      { resource: 'r', suppliedEpoch: 3, currentEpoch: 5, reason: undefined }],
    ['ZF003', { code: 'conflict', resource: 'r', operation_id: 'op', intent_id: 7 }, undefined, fg.ConflictError,
      { operationId: 'op', intentId: 7 }],
    ['ZF004', { code: 'invalid_input', field: 'payload.to[1]' }, 'payload.to[1]', fg.InvalidInputError, { field: 'payload.to[1]' }],
    ['ZF005', { code: 'lease_held', resource: 'r', holder: 'h', current_epoch: 2, expires_at: '2026-01-01T00:00:00+00:00' }, undefined,
      fg.LeaseHeldError, { holder: 'h', currentEpoch: 2, expiresAt: new Date('2026-01-01T00:00:00Z') }],
    ['ZF005', { code: 'lease_held', expires_at: '2026-01-01T02:03:04.12345+02' }, undefined,
      fg.LeaseHeldError, { expiresAt: new Date('2026-01-01T00:03:04.123Z') }],
    ['ZF005', { code: 'lease_held', expires_at: 'soon' }, undefined, fg.LeaseHeldError, { expiresAt: undefined }],
    ['ZF006', { code: 'no_principal', field: 'role', role: 'w' }, 'role', fg.NoPrincipalError, { role: 'w', field: 'role' }],
    ['ZF007', { code: 'forbidden', field: 'kind', principal: 'p' }, 'kind', fg.ForbiddenError, { field: 'kind', principal: 'p' }],
    ['ZF001', {}, undefined, fg.AuthorityChangedError, {}],
  ];
  for (const [code, detail, column, Cls, fields] of cases) {
    const raw = pgError(code, detail, column);
    const e = fg.fromPgError(raw);
    assert.ok(e instanceof Cls, code);
    assert.ok(e instanceof fg.FencegateError, code);
    assert.equal(e.sqlstate, code);
    assert.equal(e.cause, raw);
    assert.equal(e.name, Cls.name);
    assert.deepEqual(e.detail, detail);
    for (const [k, v] of Object.entries(fields)) assert.deepStrictEqual(e[k], v, `${code} ${k}`);
  }
  assert.equal(fg.fromPgError(Object.assign(new Error('dup'), { code: '23505' })), undefined);
  assert.equal(fg.fromPgError(new Error('plain')), undefined);
});

// A stand-in for the Keeper's connection: interface_version, acquire and
// renew, the renewal answered by renew().
function fakeConnection(renew) {
  return {
    ended: false,
    async query(text) {
      if (text.includes('interface_version')) return { rows: [{ v: 1 }] };
      if (text.includes('.acquire(')) return { rows: [{ epoch: '4', expires_at: new Date() }] };
      if (text.includes('.renew(')) return renew();
      return { rows: [] };
    },
    async end() { this.ended = true; },
  };
}

test('the Keeper trusts the lease until TTL - margin on its clock, and aborts its signal', async () => {
  let now = 1_000_000_000n;
  const conn = fakeConnection(() => new Promise(() => {})); // never answers
  const k = await fg.Keeper.hold({ connect: async () => conn, resource: 'r', holder: 'h', ttlMs: 60_000, clock: () => now });
  assert.equal(k.epoch, 4);
  assert.equal(k.stillValid(), true);
  now += 53_999_000_000n; // just before 54 s (60 s less 10 %)
  assert.equal(k.stillValid(), true);
  now += 2_000_000n;
  assert.equal(k.stillValid(), false);
  assert.throws(() => k.check(), fg.LeaseLostError);
  await k.stop();
  assert.equal(k.signal.aborted, true);
  assert.equal(k.error, undefined); // stopped, not lost
  // After stop, check() throws a LeaseLostError (reason stopped), as the
  // Python client's does: a caller catching LeaseLostError stops either way.
  now = 1_000_000_000n;
  assert.throws(() => k.check(), (e) => e instanceof fg.LeaseLostError && e.reason === 'stopped');
});

test('a refused renewal aborts the signal with reason stale_epoch', async () => {
  const conn = fakeConnection(async () => {
    throw pgError('ZF002', { code: 'stale_epoch', resource: 'r', supplied_epoch: 4, current_epoch: 5 });
  });
  const k = await fg.Keeper.hold({ connect: async () => conn, resource: 'r', holder: 'h', ttlMs: 300 });
  await new Promise((resolve) => k.signal.addEventListener('abort', resolve, { once: true }));
  assert.ok(k.signal.reason instanceof fg.LeaseLostError);
  assert.equal(k.signal.reason.reason, 'stale_epoch');
  assert.ok(k.signal.reason.cause instanceof fg.StaleEpochError);
  assert.equal(k.stillValid(), false);
  await k.close();
  assert.equal(conn.ended, true);
});

test('bad timings are refused naming the option', async () => {
  const connect = async () => fakeConnection(() => ({ rows: [] }));
  await assert.rejects(fg.Keeper.hold({ connect, resource: 'r', holder: 'h', ttlMs: 5 }), /^RangeError: ttlMs/);
  await assert.rejects(fg.Keeper.hold({ connect, resource: 'r', holder: 'h', ttlMs: 1000, renewEveryMs: 950 }), /^RangeError: renewEveryMs/);
});

// A stand-in for node-postgres's Client: an EventEmitter, as pg's is.
function emittingConnection(renew) {
  const { EventEmitter } = require('node:events');
  return Object.assign(new EventEmitter(), fakeConnection(renew));
}

test("a connection lost while idle ('error') does not end the process: the Keeper renews on a new one", async () => {
  const conns = [];
  const connect = async () => {
    const c = emittingConnection(async () => ({ rows: [{ expires_at: new Date() }] }));
    conns.push(c);
    return c;
  };
  const k = await fg.Keeper.hold({ connect, resource: 'r', holder: 'h', ttlMs: 60_000 });
  try {
    // node-postgres emits this on an idle client whose server went away; an
    // EventEmitter with no listener throws it (the process ends).
    conns[0].emit('error', Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' }));
    const deadline = Date.now() + 5000;
    while (k.renewals === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    assert.equal(conns.length, 2, 'a new connection');
    assert.equal(k.renewals, 1, 'renewed at once on it');
    assert.equal(k.stillValid(), true);
    assert.equal(conns[0].ended, true);
  } finally {
    await k.release();
  }
  assert.equal(conns[1].ended, true);
});

test('a lease granted with a shorter TTL is trusted no longer than that TTL', async () => {
  let now = 1_000_000_000n;
  const conn = fakeConnection(() => new Promise(() => {})); // renewals never answer
  const lease = { resource: 'r', holder: 'h', epoch: 4, expiresAt: new Date(), ttlMs: 1000 };
  const k = await fg.Keeper.hold({ connect: async () => conn, resource: 'r', holder: 'h', ttlMs: 10_000, lease, grantedAt: now, clock: () => now });
  try {
    now += 890_000_000n; // 1 s less 10 %: 900 ms
    assert.equal(k.stillValid(), true);
    now += 20_000_000n;
    assert.equal(k.stillValid(), false, 'trusted past the lease it was given (1 s) as if it were the keeper\'s (10 s)');
  } finally {
    await k.close();
  }
  const made = { resource: 'r', holder: 'h', epoch: 4, expiresAt: new Date() }; // no ttlMs: not acquire's
  await assert.rejects(fg.Keeper.hold({ connect: async () => fakeConnection(), resource: 'r', holder: 'h', ttlMs: 10_000, lease: made, grantedAt: now }),
    /^TypeError: lease: its ttlMs is unknown/);
});

test('release has a bound when the database does not answer', { timeout: 20_000 }, async () => {
  const silent = () => new Promise(() => {});
  const conn = fakeConnection(silent);
  conn.query = async function (text) {
    if (text.includes('interface_version')) return { rows: [{ v: 1 }] };
    if (text.includes('.acquire(')) return { rows: [{ epoch: '4', expires_at: new Date() }] };
    return silent(); // renewals and the release: no answer
  };
  conn.end = silent;
  const k = await fg.Keeper.hold({ connect: async () => conn, resource: 'r', holder: 'h', ttlMs: 300, releaseTimeoutMs: 500 });
  await new Promise((r) => setTimeout(r, 150)); // a renewal in flight (due at 100 ms)
  const start = Date.now();
  await assert.rejects(k.release(), /got no answer within 500ms/);
  const took = Date.now() - start;
  assert.ok(took < 2000, `release took ${took} ms, past its bound (500 ms)`);
  const k2 = await fg.Keeper.hold({ connect: async () => conn, resource: 'r', holder: 'h', ttlMs: 300, releaseTimeoutMs: 500 });
  while (!k2.signal.aborted) await new Promise((r) => setTimeout(r, 10)); // lost: expired
  const start2 = Date.now();
  await k2.release(); // nothing to release: only the renewal to stop
  assert.ok(Date.now() - start2 < 2000);
});

test('arguments of the wrong type are refused naming the field, nothing sent', async () => {
  const sent = [];
  const db = { async query(text, values) { sent.push(text); return { rows: [{}] }; } };
  const f = await fg.Fencegate.attach(db, { checkVersion: false });
  const p = { to: 'a@example.com', from: 'b@example.com', subject: 's', text: 't' };
  const enq = (o) => f.enqueue({ resource: 'r', epoch: 4, operationId: 'op', kind: 'email', payload: p, ...o });
  const cases = [
    [() => enq({ epoch: 1.5 }), 'epoch'],
    [() => enq({ epoch: '4' }), 'epoch'],
    [() => enq({ operationId: 'a\ud800' }), 'operation_id'],
    [() => enq({ operationId: '\udc00b' }), 'operation_id'],
    [() => enq({ payload: { ...p, text: 'x\ud83d' } }), 'payload.text'],
    [() => enq({ payload: { ...p, n: NaN } }), 'payload.n'],
    [() => enq({ payload: { ...p, to: ['a@example.com', Infinity] } }), 'payload.to[1]'],
    [() => f.acquire('r', 'h', NaN), 'ttl'],
    [() => f.acquire('r', 'h', '1000'), 'ttl'],
    [() => f.renew('r', 'h', 4, undefined), 'ttl'],
    [() => f.release('r', 'h', true), 'epoch'],
  ];
  for (const [call, field] of cases) {
    await assert.rejects(call(), (e) => e instanceof fg.InvalidInputError && e.field === field && e.sqlstate === 'ZF004', field);
  }
  assert.deepEqual(sent, []);
  await enq({ operationId: 'a\ud83d\ude00', payload: { ...p, text: '😀' } }); // a pair is text
  assert.equal(sent.length, 1);
  await assert.rejects(fg.Keeper.hold({ connect: async () => fakeConnection(), resource: 'r', holder: 'h', ttlMs: '1000' }), /^TypeError: ttlMs/);
});
