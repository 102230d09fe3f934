"""Keeper: a lease kept renewed, and told when it can no longer be trusted.

Trust is judged on the monotonic clock (``time.monotonic``): the lease is
trusted until TTL − margin has passed since the *start* of the last
successful renewal (or of the acquire that granted it). The start, not the
end, because PostgreSQL set the expiry at some moment after the request
left. The wall clock is never consulted, so a clock step cannot extend a
lease; and a process that was paused (SIGSTOP, a VM freeze, swapping) sees
on waking that the time is up before it asks the database anything.

A Keeper narrows the window in which a paused worker acts on a lost lease;
it cannot close it: a process paused right after ``still_valid()`` and
before its write still writes late. Only the epoch check of the write
(``enqueue``'s fence) refuses that write: always pass ``keeper.epoch``.

This is Go's ``lease.Keeper`` (lease/keeper.go) in Python, without its
pause histogram.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Any, Awaitable, Callable, Optional, Union

import psycopg

from .client import DEFAULT_SCHEMA, AsyncFencegate, Fencegate, Lease, Seconds, _interval, _Statements
from .errors import LeaseExpired, LeaseLost, StaleEpochError, from_psycopg

__all__ = ["Keeper", "AsyncKeeper", "hold", "hold_async"]

log = logging.getLogger("fencegate.keeper")

Connect = Union[str, Callable[[], psycopg.Connection]]
AsyncConnect = Union[str, Callable[[], Awaitable[psycopg.AsyncConnection]]]

# A failed renewal (not a refusal: the database unreachable, a timeout) is
# retried this soon, or at the renewal interval if that is shorter.
_RETRY = 0.1


def _seconds(v: Seconds) -> float:
    return _interval(v).total_seconds()


class _Timing:
    """The Keeper's configuration, checked as Go's KeeperConfig is."""

    def __init__(self, ttl: Seconds, renew_every: Optional[Seconds], margin: Optional[Seconds]):
        self.ttl = _seconds(ttl)
        self.renew_every = self.ttl / 3 if renew_every is None else _seconds(renew_every)
        self.margin = self.ttl / 10 if margin is None else _seconds(margin)
        if not 0.01 <= self.ttl <= 86400:
            raise ValueError(f"ttl: must be between 10ms and 24h, got {self.ttl}s")
        if self.margin < 0 or self.margin >= self.ttl:
            raise ValueError(f"margin: must be at least 0 and below the ttl, got {self.margin}s")
        if self.renew_every <= 0 or self.renew_every >= self.ttl - self.margin:
            raise ValueError(f"renew_every: must be positive and below ttl-margin ({self.ttl - self.margin}s), "
                             f"got {self.renew_every}s")


class _State:
    """What both Keepers share: the lease, the clock reading at the start of
    its last successful grant or renewal, and why it was lost."""

    def __init__(self, lease: Lease, started: float, timing: _Timing, clock: Callable[[], float]):
        self.lease = lease
        self.last_ok = started
        self.timing = timing
        self.clock = clock
        self.error: Optional[LeaseLost] = None
        self.stopping = False
        self.renewals = 0

    def trusted_until(self) -> float:
        return self.last_ok + self.timing.ttl - self.timing.margin

    def valid(self) -> bool:
        return self.error is None and not self.stopping and self.clock() < self.trusted_until()

    def expired(self) -> LeaseExpired:
        return LeaseExpired(f"no successful renewal within {self.timing.ttl - self.timing.margin:.3f}s "
                            f"(ttl {self.timing.ttl:.3f}s less the margin) on the monotonic clock")

    def lose(self, cause: BaseException) -> bool:
        """Records the loss; False when the Keeper was stopped or had lost
        the lease already (the first cause wins)."""
        if self.error is not None or self.stopping:
            return False
        err = LeaseLost(f"lease on {self.lease.resource!r} (epoch {self.lease.epoch}) can no longer be trusted: {cause}")
        err.__cause__ = cause
        self.error = err
        log.warning("fencegate: keeper: lease lost: resource=%s holder=%s epoch=%s: %s",
                    self.lease.resource, self.lease.holder, self.lease.epoch, cause)
        return True

    def check(self) -> None:
        """Raises LeaseLost unless valid()."""
        if self.valid():
            return
        if self.error is not None:
            raise self.error
        if self.stopping:
            raise LeaseLost("the keeper was stopped")
        cause = self.expired()
        raise LeaseLost(str(cause)) from cause

    def renewed(self, lease: Lease, expires_at: Any, started: float) -> None:
        """Records the renewal of lease that began at clock reading started,
        unless the lease was lost meanwhile."""
        if self.error is None:
            self.lease = dataclasses.replace(lease, expires_at=expires_at)
            self.last_ok = started
            self.renewals += 1

    @property
    def reason(self) -> Optional[str]:
        if self.error is None:
            return None
        return "stale_epoch" if isinstance(self.error.__cause__, StaleEpochError) else "expired"


class Keeper:
    """Holds a lease and keeps it renewed in the background (every
    ``renew_every``, default TTL/3), on a connection of its own.

    ``cancelled`` (a threading.Event) is set as soon as the lease can no
    longer be trusted: TTL − margin (default TTL/10) has passed on the
    monotonic clock since the last successful renewal began, or a renewal
    was refused (StaleEpochError: authority moved on). It is also set by
    ``stop()``. ``error`` then says why (a LeaseLost, chained to the cause;
    None after a plain stop).

    As a context manager it stops on exit and releases the lease if it is
    still held (``release_on_exit``)::

        with fencegate.hold(url, "invoices", "worker-a", ttl=10) as keeper:
            ...  keeper.epoch, keeper.still_valid(), keeper.cancelled

    ``connect`` is a conninfo string or a function returning a new psycopg
    connection (the Keeper sets it to autocommit). ``clock`` is the
    monotonic clock in seconds (tests may give another). With ``lease``
    (and ``granted_at``, a clock reading taken just before its acquire) it
    keeps a lease acquired elsewhere instead of acquiring one.
    """

    def __init__(self, connect: Connect, resource: str, holder: str, ttl: Seconds, *,
                 renew_every: Optional[Seconds] = None, margin: Optional[Seconds] = None,
                 schema: str = DEFAULT_SCHEMA, clock: Optional[Callable[[], float]] = None,
                 lease: Optional[Lease] = None, granted_at: Optional[float] = None,
                 release_on_exit: bool = True):
        timing = _Timing(ttl, renew_every, margin)
        clock = clock or time.monotonic
        self._connect = connect
        self._q = _Statements(schema)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cancelled = threading.Event()
        self.release_on_exit = release_on_exit
        self._conn: Optional[psycopg.Connection] = self._open()
        try:
            fg = Fencegate(self._conn, schema=schema)
            if lease is None:
                # Before the request leaves: the expiry PostgreSQL sets is later.
                granted_at = clock()
                lease = fg.acquire(resource, holder, timing.ttl)
            elif granted_at is None:
                raise ValueError("granted_at: needed with lease (a clock reading taken before its acquire)")
        except BaseException:
            self._conn.close()
            raise
        self._s = _State(lease, granted_at, timing, clock)
        self._threads = [threading.Thread(target=self._renew_loop, name="fencegate-keeper-renew", daemon=True),
                         threading.Thread(target=self._watch, name="fencegate-keeper-deadline", daemon=True)]
        for t in self._threads:
            t.start()

    # What a worker reads.

    @property
    def lease(self) -> Lease:
        with self._lock:
            return self._s.lease

    @property
    def epoch(self) -> int:
        """The lease's epoch: pass it with every write."""
        return self.lease.epoch

    @property
    def error(self) -> Optional[LeaseLost]:
        """Why the lease was lost, or None."""
        with self._lock:
            return self._s.error

    @property
    def reason(self) -> Optional[str]:
        """``expired`` (the monotonic deadline passed), ``stale_epoch`` (a
        renewal was refused), or None."""
        with self._lock:
            return self._s.reason

    @property
    def renewals(self) -> int:
        """How many renewals succeeded."""
        with self._lock:
            return self._s.renewals

    def still_valid(self) -> bool:
        """True while the lease can be trusted: not lost, not stopped, and
        the monotonic deadline not passed (read now, not when the background
        thread last looked)."""
        with self._lock:
            return self._s.valid()

    def check(self) -> None:
        """Raises LeaseLost unless still_valid()."""
        with self._lock:
            self._s.check()

    # Lifecycle.

    def stop(self) -> None:
        """Stops renewing, sets ``cancelled`` and waits for the background
        threads (a renewal in flight is cancelled). Does not release the
        lease (``release`` does). Idempotent."""
        with self._lock:
            self._s.stopping = True
        self._stop.set()
        self.cancelled.set()
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                conn.cancel()
            except Exception:  # nothing in flight, or the connection is gone
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()

    def release(self) -> None:
        """Stops, then releases the lease (unless it was lost) and closes
        the Keeper's connection."""
        self.stop()
        try:
            if self.error is None and self._conn is not None and not self._conn.closed:
                lease = self.lease
                try:
                    Fencegate(self._conn, schema=self._q.schema, check_version=False).release(
                        lease.resource, lease.holder, lease.epoch)
                except StaleEpochError:
                    pass  # taken over meanwhile: nothing of ours to release
        finally:
            self.close()

    def close(self) -> None:
        """Stops and closes the Keeper's connection, without releasing."""
        self.stop()
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> "Keeper":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.release_on_exit:
            try:
                self.release()
            except Exception as e:  # never mask the body's own exception
                log.warning("fencegate: keeper: release on exit failed: %s", e)
                self.close()
        else:
            self.close()

    # The background.

    def _open(self) -> psycopg.Connection:
        conn = psycopg.connect(self._connect) if isinstance(self._connect, str) else self._connect()
        conn.autocommit = True
        return conn

    def _watch(self) -> None:
        # The deadline has a thread of its own, so that `cancelled` is set on
        # time even while a renewal is blocked on a slow database.
        while True:
            with self._lock:
                if self._s.error is not None or self._s.stopping:
                    return
                left = self._s.trusted_until() - self._s.clock()
                if left <= 0:
                    if self._s.lose(self._s.expired()):
                        self.cancelled.set()
                    return
            self._stop.wait(left)

    def _renew_loop(self) -> None:
        with self._lock:
            next_at = self._s.last_ok + self._s.timing.renew_every
        while True:
            with self._lock:
                if self._s.error is not None or self._s.stopping:
                    return
                now = self._s.clock()
                # The deadline first: after a pause past it, the lease is not
                # trusted again on the strength of a renewal that may or may
                # not still be granted.
                if now >= self._s.trusted_until():
                    if self._s.lose(self._s.expired()):
                        self.cancelled.set()
                    return
                wait = next_at - now
                if wait <= 0:
                    lease, left = self._s.lease, self._s.trusted_until() - now
            if wait > 0:
                self._stop.wait(wait)
                continue
            started = self._s.clock()
            try:
                expires_at = self._renew(lease, left)
            except StaleEpochError as e:
                with self._lock:
                    if self._s.lose(e):
                        self.cancelled.set()
                return
            except Exception as e:
                with self._lock:
                    if self._s.error is not None or self._s.stopping:
                        return
                    retry = min(self._s.timing.renew_every, _RETRY)
                log.warning("fencegate: keeper: renew failed; retrying: %s", e)
                next_at = self._s.clock() + retry
                continue
            with self._lock:
                self._s.renewed(lease, expires_at, started)
                next_at = self._s.clock() + self._s.timing.renew_every

    def _renew(self, lease: Lease, left: float):
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self._conn = self._open()
        try:
            with conn.transaction():
                # A renewal that cannot answer before the deadline is of no use.
                conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{max(1, int(left * 1000))}ms",))
                row = conn.execute(self._q.renew, (lease.resource, lease.holder, lease.epoch,
                                                   _interval(self._s.timing.ttl))).fetchone()
        except psycopg.Error as e:
            raise (from_psycopg(e) or e) from e
        return row[0]


def hold(connect: Connect, resource: str, holder: str, ttl: Seconds, **kwargs: Any) -> Keeper:
    """Acquires a lease (a new epoch) and keeps it: Keeper(...)."""
    return Keeper(connect, resource, holder, ttl, **kwargs)


class AsyncKeeper:
    """Keeper for asyncio: ``cancelled`` is an asyncio.Event, the renewals
    and the deadline are tasks of the running loop, the connection a psycopg
    AsyncConnection of its own::

        async with await fencegate.hold_async(url, "invoices", "worker-a", ttl=10) as keeper:
            ...
    """

    def __init__(self, connect: AsyncConnect, *, schema: str = DEFAULT_SCHEMA, release_on_exit: bool = True):
        # Use AsyncKeeper.hold (or hold_async): making one acquires.
        self._connect = connect
        self._q = _Statements(schema)
        self.release_on_exit = release_on_exit
        self.cancelled = asyncio.Event()
        self._conn: Optional[psycopg.AsyncConnection] = None
        self._tasks: list = []
        self._s: _State

    @classmethod
    async def hold(cls, connect: AsyncConnect, resource: str, holder: str, ttl: Seconds, *,
                   renew_every: Optional[Seconds] = None, margin: Optional[Seconds] = None,
                   schema: str = DEFAULT_SCHEMA, clock: Optional[Callable[[], float]] = None,
                   lease: Optional[Lease] = None, granted_at: Optional[float] = None,
                   release_on_exit: bool = True) -> "AsyncKeeper":
        timing = _Timing(ttl, renew_every, margin)
        clock = clock or time.monotonic
        k = cls(connect, schema=schema, release_on_exit=release_on_exit)
        k._conn = await k._open()
        try:
            fg = await AsyncFencegate.attach(k._conn, schema=schema)
            if lease is None:
                granted_at = clock()
                lease = await fg.acquire(resource, holder, timing.ttl)
            elif granted_at is None:
                raise ValueError("granted_at: needed with lease (a clock reading taken before its acquire)")
        except BaseException:
            await k._conn.close()
            raise
        k._s = _State(lease, granted_at, timing, clock)
        k._tasks = [asyncio.ensure_future(k._renew_loop()), asyncio.ensure_future(k._watch())]
        return k

    lease = property(lambda self: self._s.lease, doc="The lease as last renewed.")
    epoch = property(lambda self: self._s.lease.epoch, doc="The lease's epoch: pass it with every write.")
    error = property(lambda self: self._s.error, doc="Why the lease was lost, or None.")
    reason = property(lambda self: self._s.reason, doc="expired, stale_epoch, or None.")
    renewals = property(lambda self: self._s.renewals, doc="How many renewals succeeded.")

    def still_valid(self) -> bool:
        return self._s.valid()

    def check(self) -> None:
        self._s.check()

    async def stop(self) -> None:
        self._s.stopping = True
        self.cancelled.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass

    async def release(self) -> None:
        await self.stop()
        try:
            if self._s.error is None and self._conn is not None and not self._conn.closed:
                if self._conn.broken:
                    return
                l = self._s.lease
                try:
                    await AsyncFencegate(self._conn, schema=self._q.schema).release(l.resource, l.holder, l.epoch)
                except StaleEpochError:
                    pass
        finally:
            await self.close()

    async def close(self) -> None:
        await self.stop()
        if self._conn is not None:
            await self._conn.close()

    async def __aenter__(self) -> "AsyncKeeper":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.release_on_exit:
            try:
                await self.release()
            except Exception as e:
                log.warning("fencegate: keeper: release on exit failed: %s", e)
                await self.close()
        else:
            await self.close()

    def _lose(self, cause: BaseException) -> None:
        if self._s.lose(cause):
            self.cancelled.set()

    async def _open(self) -> psycopg.AsyncConnection:
        if isinstance(self._connect, str):
            conn = await psycopg.AsyncConnection.connect(self._connect)
        else:
            conn = await self._connect()
        await conn.set_autocommit(True)
        return conn

    async def _watch(self) -> None:
        while self._s.error is None and not self._s.stopping:
            left = self._s.trusted_until() - self._s.clock()
            if left <= 0:
                self._lose(self._s.expired())
                return
            await asyncio.sleep(left)

    async def _renew_loop(self) -> None:
        next_at = self._s.last_ok + self._s.timing.renew_every
        while self._s.error is None and not self._s.stopping:
            now = self._s.clock()
            if now >= self._s.trusted_until():  # the deadline first, as Keeper
                self._lose(self._s.expired())
                return
            if now < next_at:
                await asyncio.sleep(next_at - now)
                continue
            lease, left, started = self._s.lease, self._s.trusted_until() - now, self._s.clock()
            try:
                expires_at = await self._renew(lease, left)
            except StaleEpochError as e:
                self._lose(e)
                return
            except Exception as e:
                if self._s.error is not None or self._s.stopping:
                    return
                log.warning("fencegate: keeper: renew failed; retrying: %s", e)
                next_at = self._s.clock() + min(self._s.timing.renew_every, _RETRY)
                continue
            self._s.renewed(lease, expires_at, started)
            next_at = self._s.clock() + self._s.timing.renew_every

    async def _renew(self, lease: Lease, left: float):
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                await conn.close()
            conn = self._conn = await self._open()
        try:
            async with conn.transaction():
                await conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{max(1, int(left * 1000))}ms",))
                cur = await conn.execute(self._q.renew, (lease.resource, lease.holder, lease.epoch,
                                                         _interval(self._s.timing.ttl)))
                row = await cur.fetchone()
        except psycopg.Error as e:
            raise (from_psycopg(e) or e) from e
        return row[0]


async def hold_async(connect: AsyncConnect, resource: str, holder: str, ttl: Seconds, **kwargs: Any) -> AsyncKeeper:
    """Acquires a lease (a new epoch) and keeps it: AsyncKeeper.hold(...)."""
    return await AsyncKeeper.hold(connect, resource, holder, ttl, **kwargs)
