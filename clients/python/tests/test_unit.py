"""Unit tests of fencegate's Python client that need no database: the
typed errors made from psycopg's, the Keeper's configuration, and its
trust judged on the clock it is given. clients/clients_test.go runs them
(python -m unittest) with the package installed; the database tests are
there."""

import datetime
import json
import types
import unittest

import fencegate
from fencegate.client import _Statements
from fencegate.keeper import _State, _Timing


class FakePgError(Exception):
    """Shaped as psycopg's error: sqlstate and diag."""


def pg_error(sqlstate, detail, column=None, message="refused"):
    e = FakePgError(message)
    e.sqlstate = sqlstate
    e.diag = types.SimpleNamespace(message_primary=message, message_detail=json.dumps(detail), column_name=column)
    return e


class TypedErrors(unittest.TestCase):
    def test_each_sqlstate(self):
        cases = [
            ("ZF002", {"code": "stale_epoch", "resource": "r", "supplied_epoch": 3, "current_epoch": 5}, None,
             fencegate.StaleEpochError, {"resource": "r", "supplied_epoch": 3, "current_epoch": 5, "reason": None}),
            ("ZF003", {"code": "conflict", "resource": "r", "operation_id": "op", "intent_id": 7}, None,
             fencegate.ConflictError, {"operation_id": "op", "intent_id": 7}),
            ("ZF004", {"code": "invalid_input", "field": "payload.to[1]"}, "payload.to[1]",
             fencegate.InvalidInputError, {"field": "payload.to[1]"}),
            ("ZF005", {"code": "lease_held", "resource": "r", "holder": "h", "current_epoch": 2,
                       "expires_at": "2026-01-01T00:00:00+00:00"}, None,
             fencegate.LeaseHeldError, {"holder": "h", "current_epoch": 2,
                                        "expires_at": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)}),
            ("ZF005", {"code": "lease_held", "expires_at": "2026-01-01T02:03:04.12345+02"}, None,
             fencegate.LeaseHeldError, {"expires_at": datetime.datetime(2026, 1, 1, 0, 3, 4, 123450, tzinfo=datetime.timezone.utc)}),
            ("ZF005", {"code": "lease_held", "expires_at": "soon"}, None,
             fencegate.LeaseHeldError, {"expires_at": None}),
            ("ZF006", {"code": "no_principal", "field": "role", "role": "w"}, "role",
             fencegate.NoPrincipalError, {"role": "w", "field": "role"}),
            ("ZF007", {"code": "forbidden", "field": "kind", "principal": "p"}, "kind",
             fencegate.ForbiddenError, {"field": "kind", "principal": "p"}),
            ("ZF001", {}, None, fencegate.AuthorityChangedError, {}),
        ]
        for sqlstate, detail, column, cls, fields in cases:
            with self.subTest(sqlstate):
                raw = pg_error(sqlstate, detail, column)
                e = fencegate.from_psycopg(raw)
                self.assertIsInstance(e, cls)
                self.assertIsInstance(e, fencegate.FencegateError)
                self.assertEqual(e.sqlstate, sqlstate)
                self.assertIs(e.__cause__, raw)
                self.assertEqual(e.detail, detail)
                for k, v in fields.items():
                    self.assertEqual(getattr(e, k), v, k)

    def test_not_fencegates(self):
        self.assertIsNone(fencegate.from_psycopg(pg_error("23505", {})))
        self.assertIsNone(fencegate.from_psycopg(ValueError("x")))

    def test_detail_not_json(self):
        raw = pg_error("ZF002", {})
        raw.diag.message_detail = "not json"
        e = fencegate.from_psycopg(raw)
        self.assertIsInstance(e, fencegate.StaleEpochError)
        self.assertIsNone(e.current_epoch)


class KeeperTiming(unittest.TestCase):
    def test_defaults(self):
        t = _Timing(3, None, None)
        self.assertAlmostEqual(t.renew_every, 1.0)
        self.assertAlmostEqual(t.margin, 0.3)

    def test_refused(self):
        for ttl, renew, margin, field in [(0.001, None, None, "ttl"), (1, 0.95, None, "renew_every"),
                                          (1, None, 1, "margin"), (1, 0, None, "renew_every")]:
            with self.subTest(field), self.assertRaisesRegex(ValueError, "^" + field):
                _Timing(ttl, renew, margin)

    def test_trust_follows_the_given_clock(self):
        now = [100.0]
        lease = fencegate.Lease("r", "h", 4, None)
        s = _State(lease, started=now[0], timing=_Timing(2, None, None), clock=lambda: now[0])
        self.assertTrue(s.valid())
        now[0] += 1.79  # just before TTL - margin (1.8 s)
        self.assertTrue(s.valid())
        now[0] += 0.02
        self.assertFalse(s.valid())
        self.assertTrue(s.lose(s.expired()))
        self.assertFalse(s.lose(fencegate.StaleEpochError("later")))  # the first cause wins
        self.assertEqual(s.reason, "expired")
        self.assertIsInstance(s.error, fencegate.LeaseLost)
        self.assertIsInstance(s.error.__cause__, fencegate.LeaseExpired)

    def test_a_lease_granted_shorter_is_trusted_no_longer(self):
        # A lease acquired elsewhere for 1 s, kept by a Keeper of 10 s: it
        # expires in the database after 1 s, so it is trusted 0.9 s (its TTL
        # less the margin, scaled), and renewed before that.
        now = [100.0]
        lease = fencegate.Lease("r", "h", 4, None, datetime.timedelta(seconds=1))
        s = _State(lease, started=now[0], timing=_Timing(10, None, None), clock=lambda: now[0])
        self.assertAlmostEqual(s.first_renewal(), 100 + 10 / 3 / 10)
        now[0] += 0.89
        self.assertTrue(s.valid())
        now[0] += 0.02
        self.assertFalse(s.valid(), "trusted past the lease it was given (1 s) as if it were the keeper's (10 s)")
        # Once renewed (by the Keeper's ttl), the Keeper's window.
        s.renewed(lease, None, now[0])
        now[0] += 8.99
        self.assertTrue(s.valid())
        self.assertEqual(s.lease.ttl, datetime.timedelta(seconds=10))

    def test_a_lease_without_its_ttl_is_refused(self):
        made = fencegate.Lease("r", "h", 4, None)  # not acquire's: its ttl is unknown
        with self.assertRaisesRegex(ValueError, "^lease: its ttl is unknown"):
            fencegate.Keeper("postgresql://nowhere.invalid/x", "r", "h", 10, lease=made, granted_at=0.0)

    def test_bad_timings_of_the_wrong_type(self):
        for ttl in ("x", None, float("nan"), True):
            with self.subTest(ttl=ttl), self.assertRaisesRegex(ValueError, "^ttl: "):
                _Timing(ttl, None, None)


class Recorder:
    """A connection that records what would be sent."""

    def __init__(self):
        self.sent = []

    def execute(self, *args):
        self.sent.append(args)
        raise AssertionError(f"sent {args}")


class BadArguments(unittest.TestCase):
    def test_refused_naming_the_field_nothing_sent(self):
        fg = fencegate.Fencegate.__new__(fencegate.Fencegate)
        fg.conn, fg._q = Recorder(), _Statements("fencegate")
        p = {"to": "a@example.com", "from": "b@example.com", "subject": "s", "text": "t"}
        cases = [
            (lambda: fg.enqueue("r", 1.5, "op", "email", p), "epoch"),
            (lambda: fg.enqueue("r", True, "op", "email", p), "epoch"),
            (lambda: fg.enqueue("r", 2 ** 63, "op", "email", p), "epoch"),
            (lambda: fg.enqueue("r", 4, "a\ud800", "email", p), "operation_id"),
            (lambda: fg.enqueue("r", 4, b"op", "email", p), "operation_id"),
            (lambda: fg.enqueue("r", 4, "op", "email", dict(p, text="x\udc00")), "payload.text"),
            (lambda: fg.enqueue("r", 4, "op", "email", dict(p, to=["a@example.com", float("inf")])), "payload.to[1]"),
            (lambda: fg.enqueue("r", 4, "op", "email", {"to\ud800": 1}), "payload"),
            (lambda: fg.acquire("r", "h", None), "ttl"),
            (lambda: fg.acquire("r", "h", "10s"), "ttl"),
            (lambda: fg.acquire("r", "h", float("nan")), "ttl"),
            (lambda: fg.acquire("r", "h", 10, failover_epoch_jump=1.5), "failover_epoch_jump"),
            (lambda: fg.renew("r", "h", 4, False), "ttl"),
            (lambda: fg.release("r", 5, 4), "holder"),
        ]
        for call, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(fencegate.InvalidInputError) as cm:
                    call()
                self.assertEqual(cm.exception.field, field)
                self.assertEqual(cm.exception.sqlstate, "ZF004")
        self.assertEqual(fg.conn.sent, [])


if __name__ == "__main__":
    unittest.main()
