"""Which database errors are worth retrying: one classifier for the state consumer, the
background loops and the API (which answers 503 with Retry-After for them).

Transient: the database cannot be reached or is not serving right now, or the transaction
lost a race; the same work succeeds later. Anything else (a constraint, a bug in a query) is
deterministic: retrying it cannot help.

How the faults arrive here (asyncpg 0.32 under SQLAlchemy 2.1 and PostgreSQL 15, checked by
``tests/system/test_db_errors.py``; 57P03 seen while ``tests/system/test_db_outage.py`` stops the server):
a server error is a ``DBAPIError`` whose ``orig`` is SQLAlchemy's adapted error carrying the
``sqlstate``, whose ``__cause__`` is the asyncpg exception. A refused TCP connection (server
down) is a bare ``ConnectionRefusedError``, and a full pool is ``sqlalchemy.exc.TimeoutError``;
neither is a ``DBAPIError``.

* ``ALTER DATABASE ... ALLOW_CONNECTIONS false``: 55000 "database ... is not currently
  accepting connections" (``ObjectNotInPrerequisiteStateError``) when connecting.
* ``pg_terminate_backend`` or a fast shutdown during a query: 08003 "connection was closed in
  the middle of operation", caused by 57P01 (``AdminShutdownError``); after it, on a closed
  connection: ``InterfaceError`` "connection is closed" with ``connection_invalidated``.
* The server shutting down or starting up: 57P03 (``CannotConnectNowError``); once it is
  gone: ``ConnectionRefusedError``.
* Too many connections: 53300 (``TooManyConnectionsError``).
* A switchover, with several hosts in the URL: the old primary refused
  (``ConnectionRefusedError``), or every host up but none the primary yet
  (``TargetServerAttributeNotMatched``); a write on a demoted primary's kept connection:
  25006, made a disconnect by ``make_engine``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from asyncpg.exceptions import TargetServerAttributeNotMatched
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from shared.outage import OutageLog
from shared.tls import tls_refusal

# SQLSTATE classes: 08 connection exception, 53 insufficient resources (too many
# connections, out of memory, disk full), 57 operator intervention (admin shutdown, cannot
# connect now, query cancelled by an operator).
_TRANSIENT_CLASSES = ("08", "53", "57")
LOST_RACE_SQLSTATES = frozenset({"40P01", "40001"})  # deadlock detected, serialization failure
# 55P03 lock_not_available: the API's lock_timeout ran out (``make_engine``); the lock's
# holder will let go, and the same work succeeds then.
_BUSY_SQLSTATES = frozenset({"55P03"})
# 55000 object_not_in_prerequisite_state is also raised by deterministic misuse (currval
# before nextval, ...), so it counts only while connecting: then it means the database does
# not accept connections right now.
_CONNECT_SQLSTATES = frozenset({"55000"})

# What the API maps to 503 (if transient) or a JSON 500 (if not): every exception a database
# call can raise that is not one of our own.
DATABASE_ERRORS: tuple[type[Exception], ...] = (SQLAlchemyError, OSError)


def database_tls_refusal(error: BaseException) -> str | None:
    """A TLS handshake with PostgreSQL that the certificates failed, in one line naming the
    setting to fix; None for any other failure."""
    return tls_refusal(error, "ORCH_DATABASE_CA_FILE", "ORCH_DATABASE_CERT_FILE", "the host in ORCH_DATABASE_URL")


def describe(error: BaseException) -> str:
    """One line for a log: a DBAPIError's text goes on with its SQL and parameters (10,000
    ids in a bulk statement). A certificate the handshake refused says which setting to fix."""
    tls = database_tls_refusal(error)
    if tls is not None:
        return tls
    lines = str(error).splitlines()
    said = lines[0] if lines else ""
    if not said and isinstance(error, TimeoutError):  # asyncpg's clock ran out: it says nothing
        said = "no answer in time (from the database, or the network to it)"
    return f"{type(error).__name__}: {said}"


def _layers(error: BaseException) -> Iterator[BaseException]:
    """An error and what it wraps: its DBAPI error (``orig``) and the driver exception below
    that (``orig.__cause__``: the adapted error wraps asyncpg's)."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen and len(seen) < 4:
        seen.append(current)
        yield current
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__


def sqlstates(error: BaseException) -> Iterator[str]:
    """The SQLSTATEs an error carries, in any of its layers."""
    for layer in _layers(error):
        code = getattr(layer, "sqlstate", None) or getattr(layer, "pgcode", None)
        if isinstance(code, str):
            yield code


def _no_host_qualifies(error: BaseException) -> bool:
    """Every host of a multi-host URL answered, none as ``target_session_attrs`` asks (a
    switchover in progress: the old primary a standby, the new one not promoted yet).
    SQLAlchemy wraps asyncpg's error in an ``InternalError``."""
    return any(isinstance(layer, TargetServerAttributeNotMatched) for layer in _layers(error))


def is_lost_race(error: BaseException) -> bool:
    """A deadlock or a serialization failure: the transaction may simply run again."""
    return any(code in LOST_RACE_SQLSTATES for code in sqlstates(error))


def is_transient(error: BaseException) -> bool:
    """True when the database is unreachable, not serving, overloaded, or the transaction
    lost a race: retry later. False for a deterministic failure."""
    if isinstance(error, OSError | PoolTimeoutError):  # OSError covers ConnectionError, TimeoutError
        return True
    if _no_host_qualifies(error):
        return True
    if isinstance(error, DBAPIError):
        if error.connection_invalidated or isinstance(error, OperationalError):
            return True
        # asyncpg's InterfaceError also reports misuse (bad arguments); only a closed
        # connection is transient (SQLAlchemy's own disconnect test looks for this text).
        if isinstance(error, InterfaceError) and "connection is closed" in str(error):
            return True
        connecting = error.statement is None
    else:
        connecting = False
    for code in sqlstates(error):
        if code.startswith(_TRANSIENT_CLASSES) or code in LOST_RACE_SQLSTATES or code in _BUSY_SQLSTATES:
            return True
        if connecting and code in _CONNECT_SQLSTATES:
            return True
    return False


def database_outage(what: str, log: logging.Logger, on_failure: Callable[[], None] | None = None) -> OutageLog:
    """How the loop doing ``what`` says the database is away (``shared.outage``); it passes
    ``describe(error)`` for each failure."""
    return OutageLog(
        log,
        f"{what}: the database is unavailable or busy",
        f"{what}: the database answers again",
        on_failure=on_failure,
    )
