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
import datetime as _dt
import logging
import math
import os
import socket
import threading
import time
from typing import Any, Awaitable, Callable, Optional, Union

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .client import DEFAULT_SCHEMA, AsyncFencegate, Fencegate, Lease, Seconds, _interval, _Statements
from .errors import LeaseExpired, LeaseLost, StaleEpochError, from_psycopg

__all__ = ["Keeper", "AsyncKeeper", "hold", "hold_async"]

log = logging.getLogger("fencegate.keeper")

Connect = Union[str, Callable[[], psycopg.Connection]]
AsyncConnect = Union[str, Callable[[], Awaitable[psycopg.AsyncConnection]]]

# A failed renewal (not a refusal: the database unreachable, a timeout) is
# retried this soon, or at the renewal interval if that is shorter.
_RETRY = 0.1

#: How long stop, close and release may take by default when the database
#: does not answer (``release_timeout``).
DEFAULT_RELEASE_TIMEOUT = 10.0


def _seconds(v: Seconds, name: str = "ttl") -> float:
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name}: must be a timedelta or a finite number of seconds, got {type(v).__name__} {v!r}")
    return float(v)


def _abort(conn: Any) -> None:
    """Shuts down conn's socket: a statement waiting on it fails at once
    ("server closed the connection"), however unresponsive the server."""
    try:
        if conn is None or conn.closed:
            return
        s = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            s.shutdown(socket.SHUT_RDWR)
        finally:
            s.close()
    except Exception:  # closed meanwhile
        pass


def _cancel(conn: Any, done: Callable[[], None]) -> None:
    """conn.cancel() (the server interrupts the statement in flight), then
    done(); in a thread of its own, as it may get no answer either."""
    try:
        conn.cancel()
    except Exception:  # nothing in flight, or the connection is gone
        pass
    finally:
        done()


class _Timing:
    """The Keeper's configuration, checked as Go's KeeperConfig is."""

    def __init__(self, ttl: Seconds, renew_every: Optional[Seconds], margin: Optional[Seconds],
                 release_timeout: Seconds = DEFAULT_RELEASE_TIMEOUT):
        self.ttl = _seconds(ttl, "ttl")
        self.renew_every = self.ttl / 3 if renew_every is None else _seconds(renew_every, "renew_every")
        self.margin = self.ttl / 10 if margin is None else _seconds(margin, "margin")
        self.release_timeout = _seconds(release_timeout, "release_timeout")
        if self.release_timeout <= 0:
            raise ValueError(f"release_timeout: must be positive, got {self.release_timeout}s")
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
        # How long the lease is trusted from last_ok: TTL − margin; for a
        # lease granted elsewhere with a shorter TTL, which expires sooner in
        # the database, that scaled to its TTL until the first renewal (the
        # first renewal is due as much sooner).
        self.scale = 1.0
        granted = lease.ttl.total_seconds() if lease.ttl is not None else None
        if granted is not None and granted < timing.ttl:
            self.scale = max(0.0, granted) / timing.ttl
        self.window = (timing.ttl - timing.margin) * self.scale

    def trusted_until(self) -> float:
        return self.last_ok + self.window

    def first_renewal(self) -> float:
        return self.last_ok + self.timing.renew_every * self.scale

    def valid(self) -> bool:
        return self.error is None and not self.stopping and self.clock() < self.trusted_until()

    def expired(self) -> LeaseExpired:
        return LeaseExpired(f"no successful renewal within {self.window:.3f}s "
                            f"(its ttl less the margin) on the monotonic clock")

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
            self.lease = dataclasses.replace(lease, expires_at=expires_at,
                                             ttl=_dt.timedelta(seconds=self.timing.ttl))
            self.last_ok = started
            self.window = self.timing.ttl - self.timing.margin
            self.scale = 1.0
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
    keeps a lease acquired elsewhere instead of acquiring one: the Lease
    that ``acquire`` returned, whose ``ttl`` it trusts it no longer than
    (scaled to it until the first renewal, which extends it by ``ttl``).

    ``stop``, ``close`` and ``release`` each take at most
    ``release_timeout`` (default 10 s) when the database does not answer:
    the renewal in flight is cancelled, and past that time the Keeper's
    connection is abandoned (its socket shut down); ``release`` then raises
    TimeoutError, and the lease expires with its TTL.
    """

    def __init__(self, connect: Connect, resource: str, holder: str, ttl: Seconds, *,
                 renew_every: Optional[Seconds] = None, margin: Optional[Seconds] = None,
                 schema: str = DEFAULT_SCHEMA, clock: Optional[Callable[[], float]] = None,
                 lease: Optional[Lease] = None, granted_at: Optional[float] = None,
                 release_on_exit: bool = True, release_timeout: Seconds = DEFAULT_RELEASE_TIMEOUT):
        timing = _Timing(ttl, renew_every, margin, release_timeout)
        _check_lease(lease, granted_at)
        clock = clock or time.monotonic
        self._connect = connect
        self._q = _Statements(schema)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cancelled = threading.Event()
        self.release_on_exit = release_on_exit
        self._renewing = False  # a renewal's statements are in flight (under _lock)
        self._stopped = False  # stop waited for the threads, or gave up on them
        self._cancelling: Optional[threading.Thread] = None
        self._conn: Optional[psycopg.Connection] = self._open()
        try:
            fg = Fencegate(self._conn, schema=schema)
            if lease is None:
                # Before the request leaves: the expiry PostgreSQL sets is later.
                granted_at = clock()
                lease = fg.acquire(resource, holder, timing.ttl)
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
        threads (a renewal in flight is cancelled), at most
        ``release_timeout``: a renewal still waiting then for a database
        that does not answer is abandoned with the connection. Does not
        release the lease (``release`` does). Idempotent."""
        self._stop_by(time.monotonic() + self._s.timing.release_timeout)

    def _stop_by(self, deadline: float) -> None:
        with self._lock:
            if self._stopped:
                return  # waited for (or abandoned) already
            self._s.stopping = True
            renewing = self._renewing
        self._stop.set()
        self.cancelled.set()
        conn = self._conn
        if renewing and self._cancelling is None and conn is not None and not conn.closed:
            # Waited for below: a cancel that arrived after the release began
            # would cancel the release.
            done = threading.Event()
            self._cancelling = threading.Thread(target=_cancel, args=(conn, done.set), daemon=True,
                                                name="fencegate-keeper-cancel")
            self._cancelling.start()
        others = [t for t in self._threads + [self._cancelling]
                  if t is not None and t is not threading.current_thread()]
        for t in others:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in others):
            # No answer by the deadline: the statement in flight fails once
            # its socket is shut down.
            _abort(self._conn)
            for t in others:
                t.join(0.5)
        with self._lock:
            self._stopped = True

    def release(self) -> None:
        """Stops, then releases the lease (unless it was lost; one taken
        over meanwhile is nothing to release) and closes the Keeper's
        connection, all within ``release_timeout``: TimeoutError when the
        database did not answer by then (the lease expires with its TTL)."""
        deadline = time.monotonic() + self._s.timing.release_timeout
        self._stop_by(deadline)
        try:
            if self.error is None:
                self._release_by(deadline)
        finally:
            self.close()

    def _release_by(self, deadline: float) -> None:
        lease = self.lease
        outcome: list = []

        def run() -> None:
            try:
                conn = self._connection(max(1.0, deadline - time.monotonic()))
                try:
                    Fencegate(conn, schema=self._q.schema, check_version=False).release(
                        lease.resource, lease.holder, lease.epoch)
                except StaleEpochError:
                    pass  # taken over meanwhile: nothing of ours to release
                outcome.append(None)
            except BaseException as e:
                outcome.append(e)

        t = threading.Thread(target=run, name="fencegate-keeper-release", daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            _abort(self._conn)
            t.join(0.5)
            raise TimeoutError(f"fencegate: the release of the lease on {lease.resource!r} (epoch {lease.epoch}) got "
                               f"no answer within {self._s.timing.release_timeout:g}s: it expires with its TTL")
        if outcome and outcome[0] is not None:
            raise outcome[0]

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

    def _open(self, connect_timeout: Optional[float] = None) -> psycopg.Connection:
        if isinstance(self._connect, str):
            kw = {}
            if connect_timeout is not None and "connect_timeout" not in conninfo_to_dict(self._connect):
                kw["connect_timeout"] = max(2, math.ceil(connect_timeout))
            conn = psycopg.connect(self._connect, **kw)
        else:
            conn = self._connect()
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
            next_at = self._s.first_renewal()
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
                    self._renewing = True
            if wait > 0:
                self._stop.wait(wait)
                continue
            started = self._s.clock()
            try:
                expires_at = self._renew(lease, left)
            except StaleEpochError as e:
                with self._lock:
                    self._renewing = False
                    if self._s.lose(e):
                        self.cancelled.set()
                return
            except Exception as e:
                with self._lock:
                    self._renewing = False
                    if self._s.error is not None or self._s.stopping:
                        return
                    retry = min(self._s.timing.renew_every, _RETRY)
                log.warning("fencegate: keeper: renew failed; retrying: %s", e)
                next_at = self._s.clock() + retry
                continue
            with self._lock:
                self._renewing = False
                self._s.renewed(lease, expires_at, started)
                next_at = self._s.clock() + self._s.timing.renew_every

    def _connection(self, timeout: float):
        """The keeper's own connection, opened again (within timeout) when it was lost."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self._conn = self._open(timeout)
        return conn

    def _renew(self, lease: Lease, left: float):
        conn = self._connection(left)
        try:
            with conn.transaction():
                # A renewal that cannot answer before the deadline is of no use.
                conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{max(1, int(left * 1000))}ms",))
                row = conn.execute(self._q.renew, (lease.resource, lease.holder, lease.epoch,
                                                   _interval(self._s.timing.ttl))).fetchone()
        except psycopg.Error as e:
            raise (from_psycopg(e) or e) from e
        return row[0]


def _check_lease(lease: Optional[Lease], granted_at: Optional[float]) -> None:
    if lease is None:
        return
    if granted_at is None:
        raise ValueError("granted_at: needed with lease (a clock reading taken before its acquire)")
    if not isinstance(lease.ttl, _dt.timedelta) or lease.ttl <= _dt.timedelta(0):
        raise ValueError("lease: its ttl is unknown: give the Lease that acquire returned (the Keeper trusts a "
                         "lease no longer than it was granted for)")


def hold(connect: Connect, resource: str, holder: str, ttl: Seconds, **kwargs: Any) -> Keeper:
    """Acquires a lease (a new epoch) and keeps it: Keeper(...)."""
    return Keeper(connect, resource, holder, ttl, **kwargs)


class AsyncKeeper:
    """Keeper for asyncio: ``cancelled`` is an asyncio.Event, the renewals
    and the deadline are tasks of the running loop, the connection a psycopg
    AsyncConnection of its own::

        async with await fencegate.hold_async(url, "invoices", "worker-a", ttl=10) as keeper:
            ...

    ``lease``, ``granted_at`` and ``release_timeout`` as for Keeper: stop,
    close and release each take at most ``release_timeout``. A renewal in
    flight is cancelled on the server, not mid-statement on the client
    (which would leave the connection busy for the release).
    """

    def __init__(self, connect: AsyncConnect, *, schema: str = DEFAULT_SCHEMA, release_on_exit: bool = True):
        # Use AsyncKeeper.hold (or hold_async): making one acquires.
        self._connect = connect
        self._q = _Statements(schema)
        self.release_on_exit = release_on_exit
        self.cancelled = asyncio.Event()
        self._conn: Optional[psycopg.AsyncConnection] = None
        self._tasks: list = []
        self._renewing = False  # a renewal's statements are in flight
        self._cancelled_on_server: Optional[asyncio.Future] = None
        self._s: _State

    @classmethod
    async def hold(cls, connect: AsyncConnect, resource: str, holder: str, ttl: Seconds, *,
                   renew_every: Optional[Seconds] = None, margin: Optional[Seconds] = None,
                   schema: str = DEFAULT_SCHEMA, clock: Optional[Callable[[], float]] = None,
                   lease: Optional[Lease] = None, granted_at: Optional[float] = None,
                   release_on_exit: bool = True,
                   release_timeout: Seconds = DEFAULT_RELEASE_TIMEOUT) -> "AsyncKeeper":
        timing = _Timing(ttl, renew_every, margin, release_timeout)
        _check_lease(lease, granted_at)
        clock = clock or time.monotonic
        k = cls(connect, schema=schema, release_on_exit=release_on_exit)
        k._conn = await k._open()
        try:
            fg = await AsyncFencegate.attach(k._conn, schema=schema)
            if lease is None:
                granted_at = clock()
                lease = await fg.acquire(resource, holder, timing.ttl)
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
        """Stops renewing and sets ``cancelled``; a renewal in flight is
        cancelled on the server and waited for, at most
        ``release_timeout`` (then abandoned with the connection). Does not
        release. Idempotent."""
        await self._stop_by(asyncio.get_running_loop().time() + self._s.timing.release_timeout)

    async def _stop_by(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        self._s.stopping = True
        self.cancelled.set()
        if not self._tasks:
            return
        renew, watch = self._tasks
        watch.cancel()
        wait = [renew, watch]
        conn = self._conn
        if not self._renewing or conn is None or conn.closed:
            renew.cancel()  # asleep, or connecting: nothing to leave half done
        elif self._cancelled_on_server is None:
            # Cancelled mid-statement, psycopg's connection would stay busy
            # ("another command is already in progress"): the server cancels
            # the statement instead, and the renewal ends by itself. conn.cancel
            # blocks, and may get no answer: a thread of its own, waited for
            # below (a cancel arriving after the release began would cancel it).
            fut = self._cancelled_on_server = loop.create_future()

            def done() -> None:
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

            threading.Thread(target=_cancel, args=(conn, done), daemon=True, name="fencegate-keeper-cancel").start()
        if self._cancelled_on_server is not None:
            wait.append(self._cancelled_on_server)
        await asyncio.wait(wait, timeout=max(0.0, deadline - loop.time()))
        if not renew.done():
            _abort(self._conn)  # no answer: the statement fails once its socket is shut down
            renew.cancel()
            await asyncio.wait([renew], timeout=0.5)
        for t in (renew, watch):
            if t.done() and not t.cancelled():
                t.exception()  # retrieved: nothing to log at exit
        self._tasks = []  # waited for, or abandoned

    async def release(self) -> None:
        """Stops, then releases the lease (unless it was lost; one taken
        over meanwhile is nothing to release) and closes the connection, all
        within ``release_timeout``: TimeoutError when the database did not
        answer by then (the lease expires with its TTL)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._s.timing.release_timeout
        await self._stop_by(deadline)
        try:
            if self._s.error is None:
                l = self._s.lease
                try:
                    await asyncio.wait_for(self._release(l), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    _abort(self._conn)
                    raise TimeoutError(f"fencegate: the release of the lease on {l.resource!r} (epoch {l.epoch}) got "
                                       f"no answer within {self._s.timing.release_timeout:g}s: it expires with its "
                                       f"TTL") from None
        finally:
            await self.close()

    async def _connection(self):
        """The keeper's own connection, opened again when it was lost."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                await conn.close()
            conn = self._conn = await self._open()
        return conn

    async def _release(self, l: Lease) -> None:
        conn = await self._connection()
        try:
            await AsyncFencegate(conn, schema=self._q.schema).release(l.resource, l.holder, l.epoch)
        except StaleEpochError:
            pass  # taken over meanwhile: nothing of ours to release

    async def close(self) -> None:
        """Stops and closes the Keeper's connection, without releasing."""
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
        next_at = self._s.first_renewal()
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
                self._renewing = True
                try:
                    expires_at = await self._renew(lease, left)
                finally:
                    self._renewing = False
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
        conn = await self._connection()
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
