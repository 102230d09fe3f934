"""fencegate for Python workers.

Thin over fencegate's versioned SQL interface (docs/sql.md): ``enqueue`` an
intent in your own psycopg 3 transaction, fenced by your lease's epoch;
``acquire``/``renew``/``release`` leases; a ``Keeper`` that renews a lease in
the background and tells you, on the monotonic clock, when it can no longer
be trusted. Refusals are typed exceptions (``StaleEpochError`` for ZF002, …).
"""

from .client import (DEFAULT_SCHEMA, INTERFACE_VERSION, AsyncFencegate, Enqueued, Fencegate, Lease, check_schema,
                     connect, connect_async)
from .errors import (AuthorityChangedError, ConflictError, FencegateError, ForbiddenError, InterfaceVersionError,
                     InvalidInputError, LeaseExpired, LeaseHeldError, LeaseLost, NoPrincipalError, StaleEpochError,
                     from_psycopg)
from .keeper import AsyncKeeper, Keeper, hold, hold_async

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SCHEMA", "INTERFACE_VERSION", "AsyncFencegate", "Enqueued", "Fencegate", "Lease", "check_schema",
    "connect", "connect_async",
    "AuthorityChangedError", "ConflictError", "FencegateError", "ForbiddenError", "InterfaceVersionError",
    "InvalidInputError", "LeaseExpired", "LeaseHeldError", "LeaseLost", "NoPrincipalError", "StaleEpochError",
    "from_psycopg",
    "AsyncKeeper", "Keeper", "hold", "hold_async",
]
