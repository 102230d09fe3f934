#!/usr/bin/env python3
"""The integration tests' worker: fencegate's Python client as a program.

clients/clients_test.go runs it with the package installed the way a user
installs it (pip install ./clients/python, into a virtual environment),
against the test run's PostgreSQL ($GATEWAY_DATABASE_URL, schema
$GATEWAY_SCHEMA). Every command prints JSON objects, one a line; a refusal
of fencegate's is printed with its exception's class and typed fields.

    driver.py version
    driver.py acquire RESOURCE HOLDER TTL_MS
    driver.py renew RESOURCE HOLDER EPOCH TTL_MS
    driver.py release RESOURCE HOLDER EPOCH
    driver.py send RESOURCE EPOCH NOTE_ID OPERATION_ID PAYLOAD_JSON
    driver.py hold RESOURCE HOLDER TTL_MS [async]
    driver.py keeper RESOURCE HOLDER TTL_MS [async]
    driver.py context RESOURCE OPERATION_ID [raise] [async]
    driver.py badargs RESOURCE EPOCH

send writes a row of its own (table client_notes, made by the test) and enqueues an email in
one transaction. hold keeps a lease with a Keeper, prints {"event":
"held"}, and on each line "check" on its standard input reports what its
Keeper says, then tries a write with the Keeper's epoch.

keeper holds a lease with a Keeper whose connections ($KEEPER_DATABASE_URL,
else $GATEWAY_DATABASE_URL) carry application_name fencegate-keeper, prints
{"event": "held"}, and reads lines: "check" reports what the Keeper says,
"release" releases (reporting how long it took and any error) and ends.

context acquires and enqueues inside `with fencegate.connect(...)` (no
transaction of its own), raising inside the block with "raise".

badargs makes calls with arguments of the wrong type and reports each error.
"""

import asyncio
import json
import os
import sys
import time

import psycopg

import fencegate

URL = os.environ["GATEWAY_DATABASE_URL"]
SCHEMA = os.environ.get("GATEWAY_SCHEMA") or "fencegate"


REFUSALS = (fencegate.FencegateError, fencegate.InterfaceVersionError)


def out(obj):
    print(json.dumps(obj, default=str), flush=True)


def error_json(e):
    """The typed exception, as the test checks it: its class and the
    attributes of that class (read from the exception, not the DETAIL)."""
    o = {"error": type(e).__name__, "sqlstate": getattr(e, "sqlstate", None), "message": str(e)}
    if isinstance(e, fencegate.StaleEpochError):
        o.update(resource=e.resource, supplied_epoch=e.supplied_epoch, current_epoch=e.current_epoch, reason=e.reason)
    elif isinstance(e, fencegate.ConflictError):
        o.update(resource=e.resource, operation_id=e.operation_id, intent_id=e.intent_id)
    elif isinstance(e, fencegate.InvalidInputError):
        o.update(field=e.field)
    elif isinstance(e, fencegate.LeaseHeldError):
        o.update(resource=e.resource, holder=e.holder, current_epoch=e.current_epoch,
                 expires_at=e.expires_at.isoformat() if e.expires_at else None)
    elif isinstance(e, fencegate.NoPrincipalError):
        o.update(role=e.role, field=e.field)
    elif isinstance(e, fencegate.ForbiddenError):
        o.update(field=e.field, principal=e.principal, resource=e.resource)
    elif isinstance(e, fencegate.InterfaceVersionError):
        o.update(schema=e.schema, wanted=e.wanted, found=e.found)
    o["is_fencegate_error"] = isinstance(e, fencegate.FencegateError)
    o["cause_is_psycopg"] = isinstance(e.__cause__, psycopg.Error)
    return o


def send(fg, resource, epoch, note_id, operation_id, payload):
    """A business row and its intent, in one transaction."""
    conn = fg.conn
    with conn.transaction():
        conn.execute("INSERT INTO client_notes (id, body) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
                     (note_id, f"note {note_id}"))
        r = fg.enqueue(resource, epoch, operation_id, "email", payload)
    return {"outcome": r.outcome, "intent_id": r.intent_id, "status": r.status, "current_epoch": r.current_epoch}


def connect():
    return fencegate.connect(URL, schema=SCHEMA, autocommit=True)


def note_payload(note_id):
    return {"to": "alice@example.com", "from": "notes@example.com", "subject": f"note {note_id}", "text": "written"}


def checked(fg, resource, keeper, n, valid, cancelled, wall):
    """The hold command's answer to its nth check: what the Keeper said
    (valid read at once, at wall; cancelled, its cancellation signal), and
    the write a worker paused right after its check would make: the fence
    refuses it, whatever the Keeper says."""
    report = {"event": "checked", "still_valid": valid, "cancelled": cancelled, "reason": keeper.reason,
              "wall": wall, "renewals": keeper.renewals}
    try:
        report["write"] = send(fg, resource, keeper.epoch, 900 + n, f"late-{n}", note_payload(900 + n))
    except REFUSALS as e:
        report["write"] = error_json(e)
    return report


def hold(resource, holder, ttl_ms):
    fg = connect()
    with fencegate.hold(URL, resource, holder, ttl_ms / 1000, schema=SCHEMA) as keeper:
        out({"event": "held", "epoch": keeper.epoch, "pid": os.getpid(), "wall": time.time()})
        n = 0
        for line in sys.stdin:
            if line.strip() != "check":
                continue
            # Read at once, before anything else can run: the Keeper's own
            # verdict after the pause, not one it learnt from a renewal.
            valid = keeper.still_valid()
            wall = time.time()
            # The background thread's verdict (the cancellation signal): it
            # is set within moments of the resumption.
            signalled = keeper.cancelled.wait(5)
            n += 1
            out(checked(fg, resource, keeper, n, valid, signalled, wall))


async def hold_async(resource, holder, ttl_ms):
    fg = connect()
    keeper = await fencegate.hold_async(URL, resource, holder, ttl_ms / 1000, schema=SCHEMA)
    async with keeper:
        out({"event": "held", "epoch": keeper.epoch, "pid": os.getpid(), "wall": time.time()})
        loop = asyncio.get_running_loop()
        n = 0
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            if line.strip() != "check":
                continue
            valid = keeper.still_valid()
            wall = time.time()
            try:
                await asyncio.wait_for(keeper.cancelled.wait(), 5)
            except asyncio.TimeoutError:
                pass
            n += 1
            out(checked(fg, resource, keeper, n, valid, keeper.cancelled.is_set(), wall))


def keeper_conninfo():
    url = os.environ.get("KEEPER_DATABASE_URL") or URL
    return psycopg.conninfo.make_conninfo(url, application_name="fencegate-keeper")


def keeper_report(keeper):
    return {"event": "checked", "still_valid": keeper.still_valid(), "reason": keeper.reason,
            "renewals": keeper.renewals, "epoch": keeper.epoch}


def keeper_lines(resource, holder, ttl_ms):
    keeper = fencegate.hold(keeper_conninfo(), resource, holder, ttl_ms / 1000, schema=SCHEMA)
    out({"event": "held", "epoch": keeper.epoch})
    for line in sys.stdin:
        line = line.strip()
        if line == "check":
            out(keeper_report(keeper))
        elif line == "release":
            start, err = time.monotonic(), None
            try:
                keeper.release()
            except Exception as e:
                err = e
            out(released(start, err))
            return
    keeper.close()


def released(start, err):
    """The keeper command's answer to release: ok or the error, and how long it took."""
    o = {"event": "released", "ok": err is None, "seconds": time.monotonic() - start}
    if err is not None:
        o["error"] = f"{type(err).__name__}: {err}"
    return o


async def keeper_lines_async(resource, holder, ttl_ms):
    keeper = await fencegate.hold_async(keeper_conninfo(), resource, holder, ttl_ms / 1000, schema=SCHEMA)
    out({"event": "held", "epoch": keeper.epoch})
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line == "check":
            out(keeper_report(keeper))
        elif line == "release":
            start, err = time.monotonic(), None
            try:
                await keeper.release()
            except Exception as e:
                err = e
            out(released(start, err))
            return
        elif not line:
            await keeper.close()
            return


class BlockFailed(Exception):
    """What the context command's block raises when asked to."""


def context_block(o, lease, r, fail):
    """The end of the context command's block: what it did, in o, then the
    raise it was asked for."""
    o.update(epoch=lease.epoch, outcome=r.outcome)
    if fail:
        raise BlockFailed("the block failed")


def context(resource, operation_id, fail, o):
    """An acquire and an enqueue inside `with fencegate.connect(...)`, in the
    connection's own transaction (no `conn.transaction()`)."""
    with fencegate.connect(URL, schema=SCHEMA) as fg:
        lease = fg.acquire(resource, "ctx", 60)
        context_block(o, lease, fg.enqueue(resource, lease.epoch, operation_id, "email", note_payload(1)), fail)


async def context_async(resource, operation_id, fail, o):
    """The same inside `async with await fencegate.connect_async(...)`."""
    async with await fencegate.connect_async(URL, schema=SCHEMA) as fg:
        lease = await fg.acquire(resource, "ctx", 60)
        context_block(o, lease, await fg.enqueue(resource, lease.epoch, operation_id, "email", note_payload(1)), fail)


def badargs(resource, epoch):
    """Each call with one argument of the wrong type (clients_test.go's
    badArgs names the same cases for every language): its error."""
    fg = connect()
    p = note_payload(1)
    cases = {
        "enqueue epoch 1.5": lambda: fg.enqueue(resource, 1.5, "op", "email", p),
        "enqueue epoch true": lambda: fg.enqueue(resource, True, "op", "email", p),
        "enqueue epoch 2^64": lambda: fg.enqueue(resource, 2 ** 64, "op", "email", p),
        "enqueue epoch NaN": lambda: fg.enqueue(resource, float("nan"), "op", "email", p),
        "enqueue epoch '1'": lambda: fg.enqueue(resource, str(epoch), "op", "email", p),
        "enqueue resource 5": lambda: fg.enqueue(5, epoch, "op", "email", p),
        "enqueue operation_id 5": lambda: fg.enqueue(resource, epoch, 5, "email", p),
        "enqueue kind 5": lambda: fg.enqueue(resource, epoch, "op", 5, p),
        "enqueue key 5": lambda: fg.enqueue(resource, epoch, "op", "email", p, key=5),
        "enqueue fence true": lambda: fg.enqueue(resource, epoch, "op", "email", p, fence=True),
        "enqueue operation_id lone surrogate": lambda: fg.enqueue(resource, epoch, "a\ud800", "email", p),
        "enqueue resource lone surrogate": lambda: fg.enqueue("r\udc00", epoch, "op", "email", p),
        "enqueue payload lone surrogate": lambda: fg.enqueue(resource, epoch, "op", "email", dict(p, text="a\ud800b")),
        "enqueue payload NaN": lambda: fg.enqueue(resource, epoch, "op", "email", dict(p, to=["a@example.com", float("nan")])),
        "acquire ttl missing": lambda: fg.acquire(resource, "w", None),
        "acquire ttl '10s'": lambda: fg.acquire(resource, "w", "10s"),
        "acquire ttl NaN": lambda: fg.acquire(resource, "w", float("nan")),
        "acquire ttl Infinity": lambda: fg.acquire(resource, "w", float("inf")),
        "acquire holder 5": lambda: fg.acquire(resource, 5, 60),
        "acquire failover_epoch_jump 1.5": lambda: fg.acquire(resource, "w", 60, failover_epoch_jump=1.5),
        "renew epoch 1.5": lambda: fg.renew(resource, "w", 1.5, 60),
        "renew ttl '10s'": lambda: fg.renew(resource, "w", epoch, "10s"),
        "release epoch true": lambda: fg.release(resource, "w", True),
    }
    o = {}
    for name, call in cases.items():
        try:
            call()
            o[name] = {"error": None}
        except Exception as e:
            o[name] = {"error": type(e).__name__, "field": getattr(e, "field", None), "message": str(e)}
    return {"cases": o}


# The commands RESOURCE HOLDER TTL_MS [async] that hold a lease with a
# Keeper: the function of each, and of each its asyncio form.
KEEPER_COMMANDS = {"hold": (hold, hold_async), "keeper": (keeper_lines, keeper_lines_async)}


def main(argv):
    cmd = argv[0]
    if cmd in KEEPER_COMMANDS:
        run_sync, run_async = KEEPER_COMMANDS[cmd]
        args = (argv[1], argv[2], int(argv[3]))
        if len(argv) > 4 and argv[4] == "async":
            asyncio.run(run_async(*args))
        else:
            run_sync(*args)
        return
    if cmd == "context":
        fail, o = "raise" in argv[3:], {}
        try:
            if "async" in argv[3:]:
                asyncio.run(context_async(argv[1], argv[2], fail, o))
            else:
                context(argv[1], argv[2], fail, o)
        except BlockFailed as e:
            o["raised"] = str(e)
        out(o)
        return
    if cmd == "badargs":
        out(badargs(argv[1], int(argv[2])))
        return
    try:
        fg = connect()
        if cmd == "version":
            o = {"interface_version": fg.interface_version(), "schema": fg.schema}
        elif cmd == "acquire":
            l = fg.acquire(argv[1], argv[2], int(argv[3]) / 1000)
            o = {"epoch": l.epoch, "expires_at": l.expires_at.isoformat()}
        elif cmd == "renew":
            o = {"expires_at": fg.renew(argv[1], argv[2], int(argv[3]), int(argv[4]) / 1000).isoformat()}
        elif cmd == "release":
            fg.release(argv[1], argv[2], int(argv[3]))
            o = {"released": True}
        elif cmd == "send":
            o = send(fg, argv[1], int(argv[2]), int(argv[3]), argv[4], json.loads(argv[5]))
        else:
            raise SystemExit(f"unknown command {cmd!r}")
    except REFUSALS as e:
        o = error_json(e)
    out(o)


if __name__ == "__main__":
    main(sys.argv[1:])
