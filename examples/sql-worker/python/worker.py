#!/usr/bin/env python3
"""A worker in Python that sends an invoice's email through fencegate.

It writes its own row (the invoice) and fencegate's intent (the email) in ONE
transaction, fenced by its lease's epoch, with fencegate's Python client
(clients/python: pip install ./clients/python). Either both commit or
neither does; a worker whose lease was taken over is refused
(fencegate.StaleEpochError, SQLSTATE ZF002) and stores nothing.

    GATEWAY_DATABASE_URL=postgres://… python3 worker.py acquire invoices worker-a 10000
    GATEWAY_DATABASE_URL=postgres://… python3 worker.py send invoices 34 1001 alice@example.com

Each command prints one JSON object. It creates its table (invoices) when
missing. $GATEWAY_SCHEMA names fencegate's schema (default fencegate).
examples/sql-worker/sql_worker_test.go runs it.
"""

import json
import os
import sys

import psycopg

import fencegate

SCHEMA = os.environ.get("GATEWAY_SCHEMA") or "fencegate"


def acquire(fg, resource, holder, ttl_ms):
    """A lease on resource: every grant is a new, higher epoch."""
    with fg.conn.transaction():  # committed before the epoch is used
        lease = fg.acquire(resource, holder, ttl_ms / 1000)
    return {"epoch": lease.epoch, "expires_at": lease.expires_at.isoformat()}


def send(fg, resource, epoch, invoice_id, email, rollback=False):
    """Record the invoice and enqueue its email, in one transaction.

    Safe to run again after a lost response: the invoice insert does nothing
    the second time, and enqueue answers 'duplicate' with the same intent.
    """
    conn = fg.conn
    with conn.transaction() as tx:
        conn.execute("INSERT INTO invoices (id, email) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
                     (invoice_id, email))
        r = fg.enqueue(resource, epoch, f"invoice-{invoice_id}", "email", {
            "to": email,
            "from": "billing@example.com",
            "subject": f"Invoice {invoice_id}",
            "text": f"Your invoice {invoice_id} is ready.",
        })
        if rollback:
            # Anything that fails after the enqueue: the intent goes with
            # the invoice.
            raise psycopg.Rollback(tx)
    return {"outcome": r.outcome, "intent_id": r.intent_id, "status": r.status,
            "current_epoch": r.current_epoch, "rolled_back": rollback}


def main(argv):
    # fencegate.connect checks the SQL interface's version.
    with fencegate.connect(os.environ["GATEWAY_DATABASE_URL"], schema=SCHEMA, autocommit=True) as fg:
        fg.conn.execute("CREATE TABLE IF NOT EXISTS invoices (id bigint PRIMARY KEY, email text NOT NULL)")
        try:
            if argv[0] == "acquire":
                out = acquire(fg, argv[1], argv[2], int(argv[3]))
            elif argv[0] in ("send", "send-rollback"):
                out = send(fg, argv[1], int(argv[2]), int(argv[3]), argv[4],
                           rollback=argv[0] == "send-rollback")
            else:
                raise SystemExit(f"unknown command {argv[0]!r}")
        except fencegate.FencegateError as e:
            # fencegate's refusals, typed: StaleEpochError (ZF002),
            # ConflictError (ZF003), InvalidInputError (ZF004, .field),
            # LeaseHeldError (ZF005), …; the DETAIL's fields are attributes.
            out = {"sqlstate": e.sqlstate, "message": e.message, "field": e.column, "detail": e.detail}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
