"""The SQL interface's calls, on the caller's own connection.

Every method runs one statement on the connection it was given, in
whatever transaction that connection is in: the caller's business rows and
fencegate's intent commit together or not at all. Refusals raise the typed
errors of :mod:`fencegate.errors`.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from .errors import InterfaceVersionError, from_psycopg

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
        epoch. payload is a JSON-able object (the kind's payload)."""
        try:
            row = self.conn.execute(self._q.enqueue, (resource, epoch, operation_id, kind, Jsonb(payload), key,
                                                     fence)).fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Enqueued(row[0], row[1], row[2], row[3])

    def acquire(self, resource: str, holder: str, ttl: Seconds, *,
                failover_epoch_jump: Optional[int] = None) -> Lease:
        """A lease on resource: a new, higher epoch. Commit before using the
        epoch (a grant rolled back was never made)."""
        try:
            if failover_epoch_jump is None:
                row = self.conn.execute(self._q.acquire, (resource, holder, _interval(ttl))).fetchone()
            else:
                row = self.conn.execute(self._q.acquire_jump, (resource, holder, _interval(ttl),
                                                               failover_epoch_jump)).fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Lease(resource, holder, row[0], row[1])

    def renew(self, resource: str, holder: str, epoch: int, ttl: Seconds) -> _dt.datetime:
        """Extends the lease by ttl from now, keeping its epoch; the new
        expiry (PostgreSQL's clock). StaleEpochError once taken over."""
        try:
            row = self.conn.execute(self._q.renew, (resource, holder, epoch, _interval(ttl))).fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return row[0]

    def release(self, resource: str, holder: str, epoch: int) -> None:
        """Frees the lease; the next acquire gets epoch + 1."""
        try:
            self.conn.execute(self._q.release, (resource, holder, epoch))
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
        try:
            cur = await self.conn.execute(self._q.enqueue, (resource, epoch, operation_id, kind, Jsonb(payload),
                                                           key, fence))
            row = await cur.fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Enqueued(row[0], row[1], row[2], row[3])

    async def acquire(self, resource: str, holder: str, ttl: Seconds, *,
                      failover_epoch_jump: Optional[int] = None) -> Lease:
        try:
            if failover_epoch_jump is None:
                cur = await self.conn.execute(self._q.acquire, (resource, holder, _interval(ttl)))
            else:
                cur = await self.conn.execute(self._q.acquire_jump, (resource, holder, _interval(ttl),
                                                                     failover_epoch_jump))
            row = await cur.fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return Lease(resource, holder, row[0], row[1])

    async def renew(self, resource: str, holder: str, epoch: int, ttl: Seconds) -> _dt.datetime:
        try:
            cur = await self.conn.execute(self._q.renew, (resource, holder, epoch, _interval(ttl)))
            row = await cur.fetchone()
        except psycopg.Error as e:
            raise _typed(e) from e
        return row[0]

    async def release(self, resource: str, holder: str, epoch: int) -> None:
        try:
            await self.conn.execute(self._q.release, (resource, holder, epoch))
        except psycopg.Error as e:
            raise _typed(e) from e


def connect(conninfo: str = "", *, schema: str = DEFAULT_SCHEMA, **kwargs: Any) -> Fencegate:
    """Opens a psycopg connection (``psycopg.connect(conninfo, **kwargs)``)
    and checks the interface version on it; ``.conn`` is the connection
    (close it, or use the Fencegate as a context manager)."""
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
    """A Fencegate on a connection of its own: closes it on exit."""

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "_Owned":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _AsyncOwned(AsyncFencegate):
    async def close(self) -> None:
        await self.conn.close()

    async def __aenter__(self) -> "_AsyncOwned":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

