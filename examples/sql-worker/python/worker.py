#!/usr/bin/env python3
"""A worker in Python that sends an invoice's email through fencegate.

It writes its own row (the invoice) and fencegate's intent (the email) in ONE
transaction, fenced by its lease's epoch, with fencegate's SQL interface
(docs/sql.md). Either both commit or neither does; a worker whose lease was
taken over is refused (SQLSTATE ZF002) and stores nothing.

    GATEWAY_DATABASE_URL=postgres://… python3 worker.py acquire invoices worker-a 10000
    GATEWAY_DATABASE_URL=postgres://… python3 worker.py send invoices 34 1001 alice@example.com

Each command prints one JSON object. It needs psycopg 3 (Debian:
python3-psycopg; pip: psycopg). $GATEWAY_SCHEMA names fencegate's schema
(default fencegate). examples/sql-worker/sql_worker_test.go runs it.
"""

import json
import os
import sys

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

SCHEMA = sql.Identifier(os.environ.get("GATEWAY_SCHEMA") or "fencegate")


def acquire(conn, resource, holder, ttl_ms):
    """A lease on resource: every grant is a new, higher epoch."""
    with conn.transaction():
        epoch, expires_at = conn.execute(
            sql.SQL("SELECT epoch, expires_at FROM {}.acquire(%s, %s, %s * interval '1 millisecond')").format(SCHEMA),
            (resource, holder, ttl_ms),
        ).fetchone()
    return {"epoch": epoch, "expires_at": expires_at.isoformat()}


def send(conn, resource, epoch, invoice_id, email, rollback=False):
    """Record the invoice and enqueue its email, in one transaction.

    Safe to run again after a lost response: the invoice insert does nothing
    the second time, and enqueue answers 'duplicate' with the same intent.
    """
    with conn.transaction() as tx:
        conn.execute(
            "INSERT INTO invoices (id, email) VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
            (invoice_id, email),
        )
        outcome, intent_id, status, current_epoch = conn.execute(
            sql.SQL(
                "SELECT outcome, intent_id, status, current_epoch FROM {}.enqueue("
                "resource => %s, epoch => %s, operation_id => %s, kind => 'email', payload => %s)"
            ).format(SCHEMA),
            (
                resource,
                epoch,
                f"invoice-{invoice_id}",
                Jsonb({
                    "to": email,
                    "from": "billing@example.com",
                    "subject": f"Invoice {invoice_id}",
                    "text": f"Your invoice {invoice_id} is ready.",
                }),
            ),
        ).fetchone()
        if rollback:
            # Anything that fails after the enqueue: the intent goes with
            # the invoice.
            raise psycopg.Rollback(tx)
    return {"outcome": outcome, "intent_id": intent_id, "status": status,
            "current_epoch": current_epoch, "rolled_back": rollback}


def main(argv):
    with psycopg.connect(os.environ["GATEWAY_DATABASE_URL"], autocommit=True) as conn:
        try:
            if argv[0] == "acquire":
                out = acquire(conn, argv[1], argv[2], int(argv[3]))
            elif argv[0] in ("send", "send-rollback"):
                out = send(conn, argv[1], int(argv[2]), int(argv[3]), argv[4],
                           rollback=argv[0] == "send-rollback")
            else:
                raise SystemExit(f"unknown command {argv[0]!r}")
        except psycopg.Error as e:
            # fencegate's refusals: ZF002 stale epoch, ZF003 conflict,
            # ZF004 invalid input (the column names the field), ZF005
            # lease held; the detail is JSON.
            if not (e.sqlstate or "").startswith("ZF"):
                raise
            out = {
                "sqlstate": e.sqlstate,
                "message": e.diag.message_primary,
                "field": e.diag.column_name,
                "detail": json.loads(e.diag.message_detail or "{}"),
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
