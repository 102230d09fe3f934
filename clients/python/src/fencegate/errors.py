"""fencegate's refusals as typed exceptions.

The SQL interface refuses with SQLSTATEs of class ZF, a JSON object in the
error's DETAIL and the field in its COLUMN (docs/sql.md, "Errors"). Every
call of this package raises the matching subclass of FencegateError, with
the DETAIL's fields as attributes, chained to psycopg's error
(``__cause__``). The caller's transaction is aborted either way
(PostgreSQL's rule): roll it back, then retry or give up.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from typing import Any, Dict, Optional

__all__ = [
    "FencegateError",
    "AuthorityChangedError",
    "StaleEpochError",
    "ConflictError",
    "InvalidInputError",
    "LeaseHeldError",
    "NoPrincipalError",
    "ForbiddenError",
    "InterfaceVersionError",
    "LeaseLost",
    "LeaseExpired",
    "from_psycopg",
]


class FencegateError(Exception):
    """A refusal of fencegate's SQL interface (SQLSTATE class ZF).

    ``sqlstate`` is the SQLSTATE, ``code`` the DETAIL's code
    (``stale_epoch``, …), ``detail`` the whole DETAIL object, ``column`` the
    error's COLUMN (the field it names, if any).
    """

    sqlstate: str = ""

    def __init__(self, message: str, *, sqlstate: str = "", detail: Optional[Dict[str, Any]] = None,
                 column: Optional[str] = None):
        super().__init__(message)
        self.message = message
        if sqlstate:
            self.sqlstate = sqlstate
        self.detail: Dict[str, Any] = dict(detail or {})
        self.code: Optional[str] = self.detail.get("code")
        self.column = column


class AuthorityChangedError(FencegateError):
    """ZF001: the database is not the epoch authority on record (after a
    failover that cannot be trusted, or a restore); nothing was granted."""

    sqlstate = "ZF001"


class StaleEpochError(FencegateError):
    """ZF002: the epoch is not the resource's current one: authority moved
    on (a takeover), and nothing of the transaction may commit.

    ``reason`` is set for renew and release ("the lease is held by …").
    """

    sqlstate = "ZF002"

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.resource: Optional[str] = self.detail.get("resource")
        self.supplied_epoch: Optional[int] = self.detail.get("supplied_epoch")
        self.current_epoch: Optional[int] = self.detail.get("current_epoch")
        self.reason: Optional[str] = self.detail.get("reason")


class ConflictError(FencegateError):
    """ZF003: the operation id was committed before with different content."""

    sqlstate = "ZF003"

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.resource: Optional[str] = self.detail.get("resource")
        self.operation_id: Optional[str] = self.detail.get("operation_id")
        self.intent_id: Optional[int] = self.detail.get("intent_id")


class InvalidInputError(FencegateError, ValueError):
    """ZF004: a missing or invalid argument or payload field (``field``:
    ``epoch``, ``payload.to[1]``, …); nothing was stored."""

    sqlstate = "ZF004"

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.field: Optional[str] = self.detail.get("field") or self.column


class LeaseHeldError(FencegateError):
    """ZF005: acquire while another holder's lease is live."""

    sqlstate = "ZF005"

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.resource: Optional[str] = self.detail.get("resource")
        self.holder: Optional[str] = self.detail.get("holder")
        self.current_epoch: Optional[int] = self.detail.get("current_epoch")
        # When the holder's lease expires unless renewed, by the database's
        # clock (a lease's expires_at is a datetime too); None if absent.
        self.expires_at: Optional[_dt.datetime] = _timestamp(self.detail.get("expires_at"))


class NoPrincipalError(FencegateError):
    """ZF006: a rule set is in force and the calling role is mapped to no
    principal (``role``)."""

    sqlstate = "ZF006"

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.role: Optional[str] = self.detail.get("role")
        self.field: Optional[str] = self.detail.get("field") or self.column


class ForbiddenError(FencegateError):
    """ZF007: the role's principal may not do this: ``field`` names what
    (``resource``, ``kind``, ``role``, ``principal``)."""

    sqlstate = "ZF007"

    def __init__(self, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.field: Optional[str] = self.detail.get("field") or self.column
        self.principal: Optional[str] = self.detail.get("principal")
        self.resource: Optional[str] = self.detail.get("resource")
        self.kind: Optional[str] = self.detail.get("kind")


class InterfaceVersionError(Exception):
    """The database does not offer the SQL interface this package speaks:
    fencegate is not installed in the schema, the role may not use it, or
    its interface_version() is another one. ``found`` is the version found
    (None when there is none). Not a refusal (no SQLSTATE of class ZF), so
    not a FencegateError."""

    def __init__(self, message: str, *, schema: str, wanted: int, found: Optional[int]):
        super().__init__(message)
        self.schema, self.wanted, self.found = schema, wanted, found


class LeaseLost(Exception):
    """A Keeper's lease can no longer be trusted. The cause is a
    StaleEpochError (a renewal was refused: authority moved on) or a
    LeaseExpired (no renewal succeeded within TTL − margin)."""


class LeaseExpired(Exception):
    """No renewal succeeded within TTL − margin on the monotonic clock
    since the last one began: the lease may have expired in the database,
    and another holder may have it."""


_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d(?::?\d\d)?)")


def _timestamp(v: Any) -> Optional[_dt.datetime]:
    """An aware datetime of an ISO 8601 timestamp as PostgreSQL's JSON
    writes it (1 to 6 fraction digits, offset +00 or +00:00); None if v is
    not one. Python 3.9's fromisoformat takes only 3 or 6 digits."""
    m = _TIMESTAMP.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        return None
    base, frac, tz = m.groups()
    tz = "+00:00" if tz == "Z" else tz
    if len(tz) == 3:
        tz += ":00"
    elif ":" not in tz:
        tz = tz[:3] + ":" + tz[3:]
    try:
        return _dt.datetime.fromisoformat(base + "." + (frac or "")[:6].ljust(6, "0") + tz)
    except ValueError:
        return None


_BY_SQLSTATE = {c.sqlstate: c for c in (AuthorityChangedError, StaleEpochError, ConflictError, InvalidInputError,
                                        LeaseHeldError, NoPrincipalError, ForbiddenError)}


def from_psycopg(err: BaseException) -> Optional[FencegateError]:
    """The typed error for psycopg's error err, or None when err is not a
    refusal of fencegate's (not a psycopg error, or its SQLSTATE is not of
    class ZF). For statements of your own that call the interface."""
    sqlstate = getattr(err, "sqlstate", None) or ""
    if not sqlstate.startswith("ZF"):
        return None
    diag = getattr(err, "diag", None)
    message = getattr(diag, "message_primary", None) or str(err)
    raw = getattr(diag, "message_detail", None)
    try:
        detail = json.loads(raw) if raw else {}
        if not isinstance(detail, dict):
            detail = {}
    except ValueError:
        detail = {}
    cls = _BY_SQLSTATE.get(sqlstate, FencegateError)
    typed = cls(message, sqlstate=sqlstate, detail=detail, column=getattr(diag, "column_name", None))
    typed.__cause__ = err
    return typed
