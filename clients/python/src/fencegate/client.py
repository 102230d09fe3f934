"""The SQL interface's calls, on the caller's own connection.

Every method runs one statement on the connection it was given, in
whatever transaction that connection is in: the caller's business rows and
fencegate's intent commit together or not at all. Refusals raise the typed
errors of :mod:`fencegate.errors`.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from .errors import InterfaceVersionError, InvalidInputError, from_psycopg

__all__ = [
    "INTERFACE_VERSION",
    "DEFAULT_SCHEMA",
    "Enqueued",
    "Lease",
    "Fencegate",
    "AsyncFencegate",
    "connect",
    "connect_async",
    "check_schema",
]

#: The version of the SQL interface this package speaks (docs/sql.md):
#: ``<schema>.interface_version()`` must return it.
INTERFACE_VERSION = 1

#: fencegate's schema unless told otherwise (``gateway migrate --schema``).
DEFAULT_SCHEMA = "fencegate"

_log = logging.getLogger("fencegate")

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]*$")

Seconds = Union[float, int, _dt.timedelta]


def check_schema(schema: str) -> str:
    """schema, if it is a name fencegate accepts (a lower-case identifier
    of at most 40 bytes); else ValueError naming ``schema``."""
    if not isinstance(schema, str) or not _SCHEMA_RE.match(schema) or len(schema) > 40:
        raise ValueError(f"schema: must be a lower-case identifier of at most 40 bytes, got {schema!r}")
    return schema


def _interval(ttl: Seconds) -> _dt.timedelta:
    return ttl if isinstance(ttl, _dt.timedelta) else _dt.timedelta(seconds=float(ttl))


# The arguments' checks, made before anything is sent: a value of the wrong
# type is refused as the database refuses a bad value, InvalidInputError
# (ZF004) naming the field (the SQL argument's name, as in the TypeScript
# and Java clients). psycopg would send 1.5 as a double precision, which
# matches no function ("function fencegate.enqueue(...) does not exist").

def _invalid(field: str, why: str) -> InvalidInputError:
    return InvalidInputError(f"invalid input: {field}: {why}", sqlstate="ZF004",
                             detail={"code": "invalid_input", "field": field}, column=field)


def _text(field: str, v: Any) -> Optional[str]:
    """v as a text argument: a str that is UTF-8 (no lone surrogate), or
    None (for the database to refuse naming it when it is required)."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise _invalid(field, f"must be a str, got {type(v).__name__} {v!r}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _invalid(field, f"a lone surrogate (U+{ord(v[e.start]):04X}) at offset {e.start} is not text") from None
    return v


def _integer(field: str, v: Any) -> Optional[int]:
    """v as a bigint argument: an int (not a bool), or None."""
    if v is None:
        return None
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise _invalid(field, f"must be an integer, got {type(v).__name__} {v!r}")
    v = int(v.__index__())
    if not -(2 ** 63) <= v < 2 ** 63:
        raise _invalid(field, f"must fit in a bigint, got {v}")
    return v


def _ttl(v: Any) -> _dt.timedelta:
    """v as a ttl: a timedelta or a finite number of seconds (its range is
    the database's to check, naming ttl)."""
    if isinstance(v, _dt.timedelta):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _invalid("ttl", f"must be a timedelta or a finite number of seconds, got {type(v).__name__} {v!r}")
    # Clamped to about 31,000 years either way, which the database refuses
    # naming ttl (a timedelta cannot hold much more).
    return _dt.timedelta(seconds=max(-1e12, min(1e12, float(v))))


def _payload(v: Any, path: str = "payload") -> Any:
    """Checks a payload before it is encoded: no lone surrogate in a
    string or a name, and no float JSON cannot carry (NaN, ±Infinity, which
    json writes as NaN and PostgreSQL refuses), naming where
    (``payload.to[1]``). Returns v."""
    if isinstance(v, str):
        _text(path, v)
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise _invalid(path, f"{v} is not a JSON number")
    elif isinstance(v, dict):
        for k, e in v.items():
            if isinstance(k, str):
                _text(path, k)
            _payload(e, f"{path}.{k}")
    elif isinstance(v, (list, tuple)):
        for i, e in enumerate(v):
            _payload(e, f"{path}[{i}]")
    return v


@dataclass(frozen=True)
class Enqueued:
    """What enqueue answered. ``outcome`` is ``created`` (a new intent,
    relayed once your transaction commits) or ``duplicate`` (the operation
    id was committed before with the same content: a retry after a lost
    response; the same ``intent_id``, whatever the epoch is now)."""

    outcome: str
    intent_id: int
    status: str
    current_epoch: int

    @property
    def created(self) -> bool:
        return self.outcome == "created"

    @property
    def duplicate(self) -> bool:
        return self.outcome == "duplicate"


@dataclass(frozen=True)
class Lease:
    """A lease as granted or renewed: pass ``epoch`` with every write."""

    resource: str
    holder: str
    epoch: int
    expires_at: _dt.datetime  # PostgreSQL's clock: for people, never for deciding
    #: The time to live it was granted with (set by acquire): a Keeper given
    #: this lease trusts it no longer.
    ttl: Optional[_dt.timedelta] = None


def _driver_connection(conn: Any) -> Any:
    """psycopg's connection under conn: conn itself, or the one under an
    SQLAlchemy 2 Connection (``conn.connection.driver_connection``), so
    that the calls join SQLAlchemy's transaction."""
    if isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)):
        return conn
    inner = getattr(conn, "connection", None)
    driver = getattr(inner, "driver_connection", None)
    if isinstance(driver, (psycopg.Connection, psycopg.AsyncConnection)):
        return driver
    driver = getattr(conn, "driver_connection", None)
    if isinstance(driver, (psycopg.Connection, psycopg.AsyncConnection)):
        return driver
    raise TypeError(f"a psycopg 3 connection (or an SQLAlchemy connection over psycopg) is needed, got {type(conn).__name__}")


class _Statements:
    """The interface's statements for one schema."""

    def __init__(self, schema: str):
        s = sql.Identifier(check_schema(schema))
        self.schema = schema
        self.version = sql.SQL("SELECT {}.interface_version()").format(s)
        self.enqueue = sql.SQL(
            "SELECT outcome, intent_id, status, current_epoch FROM {}.enqueue("
            "resource => %s, epoch => %s, operation_id => %s, kind => %s, payload => %s, key => %s, fence => %s)"
        ).format(s)
        self.acquire = sql.SQL(
            "SELECT epoch, expires_at FROM {}.acquire(resource => %s, holder => %s, ttl => %s)").format(s)
        self.acquire_jump = sql.SQL(
            "SELECT epoch, expires_at FROM {}.acquire(resource => %s, holder => %s, ttl => %s, "
            "failover_epoch_jump => %s)").format(s)
        self.renew = sql.SQL("SELECT {}.renew(resource => %s, holder => %s, epoch => %s, ttl => %s)").format(s)
        self.release = sql.SQL("SELECT {}.release(resource => %s, holder => %s, epoch => %s)").format(s)

    def acquire_args(self, resource: Any, holder: Any, ttl: Any, jump: Any) -> tuple:
        args = (_text("resource", resource), _text("holder", holder), _ttl(ttl))
        if jump is None:
            return self.acquire, args
        return self.acquire_jump, args + (_integer("failover_epoch_jump", jump),)

    def version_error(self, found: Optional[int], cause: Optional[BaseException] = None) -> InterfaceVersionError:
        if found is None:
            why = (f"{self.schema}.interface_version() cannot be called ({cause}): is fencegate installed in schema "
                   f"{self.schema!r} (gateway migrate --schema), and is this role granted USAGE on it?")
        else:
            why = (f"{self.schema}.interface_version() is {found}, but this package speaks version "
                   f"{INTERFACE_VERSION}: use the client of that version")
        err = InterfaceVersionError(why, schema=self.schema, wanted=INTERFACE_VERSION, found=found)
        err.__cause__ = cause
        return err


def _enqueue_args(resource: Any, epoch: Any, operation_id: Any, kind: Any, payload: Any, key: Any,
                  fence: Any) -> tuple:
    return (_text("resource", resource), _integer("epoch", epoch), _text("operation_id", operation_id),
            _text("kind", kind), Jsonb(_payload(payload)), _text("key", key), _text("fence", fence))


def _typed(err: BaseException) -> BaseException:
    return from_psycopg(err) or err


class Fencegate:
    """fencegate's SQL interface on a psycopg 3 connection (or an SQLAlchemy
    2 connection over psycopg).

    The calls run in the connection's current transaction: open one
    (``with conn.transaction():``), write your rows, enqueue, and commit;
    a refusal aborts all of it. The interface version is checked when the
    object is made (``check_version=False`` skips that), inside a
    savepoint, so a failed check leaves a transaction in progress usable.
    """

    def __init__(self, conn: Any, *, schema: str = DEFAULT_SCHEMA, check_version: bool = True):
        self.conn = _driver_connection(conn)
        if isinstance(self.conn, psycopg.AsyncConnection):
            raise TypeError("an AsyncConnection: use AsyncFencegate.attach")
        self._q = _Statements(schema)
        if check_version:
            found = self.interface_version()
            if found != INTERFACE_VERSION:
                raise self._q.version_error(found)

    @property
    def schema(self) -> str:
        return self._q.schema

    def interface_version(self) -> int:
        """``<schema>.interface_version()``; InterfaceVersionError when it
        cannot be called."""
        try:
            with self.conn.transaction():
                row = self.conn.execute(self._q.version).fetchone()
        except psycopg.Error as e:
            raise self._q.version_error(None, e) from e
        return int(row[0])

    def enqueue(self, resource: str, epoch: int, operation_id: str, kind: str, payload: Any, *,
                key: Optional[str] = None, fence: Optional[str] = None) -> Enqueued:
        """Enqueue an intent in the connection's transaction, fenced by
        epoch. payload is a JSON-able object (the kind's payload). A value of
        the wrong type (an epoch of 1.5, a lone surrogate in a string, a NaN
        in the payload) is refused before anything is sent:
        InvalidInputError naming the field."""
        args = _enqueue_args(resource, epoch, operation_id, kind, payload, key, fence)
        try:
            row = self.conn.execute(self._q.enqueue, args).fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Enqueued(row[0], row[1], row[2], row[3])

    def acquire(self, resource: str, holder: str, ttl: Seconds, *,
                failover_epoch_jump: Optional[int] = None) -> Lease:
        """A lease on resource: a new, higher epoch. Commit before using the
        epoch (a grant rolled back was never made)."""
        q, args = self._q.acquire_args(resource, holder, ttl, failover_epoch_jump)
        try:
            row = self.conn.execute(q, args).fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Lease(resource, holder, row[0], row[1], args[2])

    def renew(self, resource: str, holder: str, epoch: int, ttl: Seconds) -> _dt.datetime:
        """Extends the lease by ttl from now, keeping its epoch; the new
        expiry (PostgreSQL's clock). StaleEpochError once taken over."""
        args = (_text("resource", resource), _text("holder", holder), _integer("epoch", epoch), _ttl(ttl))
        try:
            row = self.conn.execute(self._q.renew, args).fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return row[0]

    def release(self, resource: str, holder: str, epoch: int) -> None:
        """Frees the lease; the next acquire gets epoch + 1."""
        args = (_text("resource", resource), _text("holder", holder), _integer("epoch", epoch))
        try:
            self.conn.execute(self._q.release, args)
        except psycopg.Error as e:
            raise _typed(e) from e


class AsyncFencegate:
    """Fencegate on a psycopg 3 AsyncConnection: ``await
    AsyncFencegate.attach(conn)`` checks the interface version."""

    def __init__(self, conn: Any, *, schema: str = DEFAULT_SCHEMA):
        self.conn = _driver_connection(conn)
        if not isinstance(self.conn, psycopg.AsyncConnection):
            raise TypeError("not an AsyncConnection: use Fencegate")
        self._q = _Statements(schema)

    @classmethod
    async def attach(cls, conn: Any, *, schema: str = DEFAULT_SCHEMA, check_version: bool = True) -> "AsyncFencegate":
        fg = cls(conn, schema=schema)
        if check_version:
            found = await fg.interface_version()
            if found != INTERFACE_VERSION:
                raise fg._q.version_error(found)
        return fg

    @property
    def schema(self) -> str:
        return self._q.schema

    async def interface_version(self) -> int:
        try:
            async with self.conn.transaction():
                cur = await self.conn.execute(self._q.version)
                row = await cur.fetchone()
        except psycopg.Error as e:
            raise self._q.version_error(None, e) from e
        return int(row[0])

    async def enqueue(self, resource: str, epoch: int, operation_id: str, kind: str, payload: Any, *,
                      key: Optional[str] = None, fence: Optional[str] = None) -> Enqueued:
        args = _enqueue_args(resource, epoch, operation_id, kind, payload, key, fence)
        try:
            cur = await self.conn.execute(self._q.enqueue, args)
            row = await cur.fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Enqueued(row[0], row[1], row[2], row[3])

    async def acquire(self, resource: str, holder: str, ttl: Seconds, *,
                      failover_epoch_jump: Optional[int] = None) -> Lease:
        q, args = self._q.acquire_args(resource, holder, ttl, failover_epoch_jump)
        try:
            cur = await self.conn.execute(q, args)
            row = await cur.fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Lease(resource, holder, row[0], row[1], args[2])

    async def renew(self, resource: str, holder: str, epoch: int, ttl: Seconds) -> _dt.datetime:
        args = (_text("resource", resource), _text("holder", holder), _integer("epoch", epoch), _ttl(ttl))
        try:
            cur = await self.conn.execute(self._q.renew, args)
            row = await cur.fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return row[0]

    async def release(self, resource: str, holder: str, epoch: int) -> None:
        args = (_text("resource", resource), _text("holder", holder), _integer("epoch", epoch))
        try:
            await self.conn.execute(self._q.release, args)
        except psycopg.Error as e:
            raise _typed(e) from e


def connect(conninfo: str = "", *, schema: str = DEFAULT_SCHEMA, **kwargs: Any) -> Fencegate:
    """Opens a psycopg connection (``psycopg.connect(conninfo, **kwargs)``)
    and checks the interface version on it; ``.conn`` is the connection.
    Close it, or use the Fencegate as a context manager, which does what
    psycopg's ``with conn`` does: on leaving the block it commits (or, when
    the block raised, rolls back) what the connection's transaction holds,
    then closes it."""
    conn = psycopg.connect(conninfo, **kwargs)
    try:
        return _Owned(conn, schema=schema)
    except BaseException:
        conn.close()
        raise


async def connect_async(conninfo: str = "", *, schema: str = DEFAULT_SCHEMA, **kwargs: Any) -> AsyncFencegate:
    """connect for asyncio (``psycopg.AsyncConnection.connect``)."""
    conn = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
    try:
        return await _AsyncOwned.attach(conn, schema=schema)
    except BaseException:
        await conn.close()
        raise


class _Owned(Fencegate):
    """A Fencegate on a connection of its own. As a context manager it ends
    as psycopg's connection does: commit on a clean exit, roll back on an
    exception, then close."""

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "_Owned":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.conn.closed:
            return
        try:
            if exc_type is None:
                self.conn.commit()
            else:
                try:
                    self.conn.rollback()
                except Exception as e:  # never mask the block's own exception
                    _log.warning("fencegate: rollback on exit failed: %s", e)
        finally:
            self.close()


class _AsyncOwned(AsyncFencegate):
    """_Owned for asyncio."""

    async def close(self) -> None:
        await self.conn.close()

    async def __aenter__(self) -> "_AsyncOwned":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.conn.closed:
            return
        try:
            if exc_type is None:
                await self.conn.commit()
            else:
                try:
                    await self.conn.rollback()
                except Exception as e:
                    _log.warning("fencegate: rollback on exit failed: %s", e)
        finally:
            await self.close()

