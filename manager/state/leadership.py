"""Which of several managers applies state reports and runs the repairs: the leader.

Every manager serves the API; only the leader's state side consumes ``orch.state`` and runs
``manager/repairs``. The leader is whoever holds the leader lock, a PostgreSQL session-level
advisory lock (``manager/db/leader.py``) on a connection of its own:

* The lock proves a session, not a writable primary: PostgreSQL grants it on a hot standby
  and on a primary set read-only for a switchover, so a manager that reached one of those
  would lead beside the one on the primary. So the leader also writes its row of ``leader``
  on that session, when it takes the lock and at each check: a server that refuses the
  write is not led from (the lock is dropped, the manager stands by and says why).
* A manager that exits, or is killed, closes the connection and the lock is free at once; a
  standby tries for it every ``_TRY_EVERY_S``, so it takes over within about a second.
* A leader frozen or cut off from PostgreSQL keeps the connection open but sends nothing:
  the server ends that session after ``ORCH_LEADER_TIMEOUT_S`` (``idle_session_timeout``),
  which frees the lock. The leader writes every quarter of that to stay leader.
* A leader whose statement fails, or gets no answer within half of it, gives up the lead at
  once: its state side stops (its consumer's channel closed, so whatever it had not applied
  goes back to the queue), and it becomes a standby. Either way the lock is lost only after
  the state side stopped or could not reach the database; what the old leader committed and
  did not ack is redelivered to the new one, which skips what was applied
  (``applied_state_messages``, ``manager/state/consumer.py``).

The state queue's single active consumer stays as a second guard: a leader's consumer is the
only one, so it is the active one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from manager.db import leader
from manager.db.errors import database_outage, describe, is_transient
from manager.metrics import STATE_LEADER
from shared.outage import OutageLog

logger = logging.getLogger(__name__)

_TRY_EVERY_S = 1.0


class LeaderLock:
    def __init__(self, engine: AsyncEngine, name: str, timeout_s: float) -> None:
        self.engine = engine
        self.name = name
        self.timeout_s = timeout_s
        self._connection: AsyncConnection | None = None
        self._database = database_outage("waiting to lead", logger)
        self._read_only = OutageLog(
            logger,
            "not leading: the database this manager reached refuses writes (a standby, or a primary being "
            "demoted); its leader lock proves nothing there",
            "the database takes writes again: this manager may lead",
        )
        self._doubted = asyncio.Event()

    async def acquire(self) -> None:
        """Return once this manager holds the lock (trying every ``_TRY_EVERY_S``)."""
        said_standby = False
        while True:
            try:
                if await self._try():
                    self._database.worked()
                    STATE_LEADER.set(1)
                    logger.info("this manager (%s) now applies state reports and runs the repairs", self.name)
                    return
            except Exception as e:
                await self._drop()
                if not is_transient(e):
                    raise
                self._database.failed(describe(e))
            else:
                self._database.worked()
                if not said_standby:
                    said_standby = True
                    logger.info("another manager applies state reports; %s stands by", self.name)
            await asyncio.sleep(_TRY_EVERY_S)

    async def _try(self) -> bool:
        if self._connection is None:
            connection = await self.engine.connect()
            self._connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            if not await leader.name_session(self._connection, self.name, round(self.timeout_s * 1000)):
                logger.warning(
                    "PostgreSQL is older than 14 (no idle_session_timeout): a frozen leader keeps the lead "
                    "until its connection breaks"
                )
        if not await leader.try_lock(self._connection):
            return False
        try:
            # Bounded: a primary whose synchronous standby is gone takes no commit either.
            await asyncio.wait_for(leader.still_here(self._connection, self.name), self.timeout_s / 2)
        except Exception as e:
            await self._drop()  # the lock with it
            if not leader.refused_as_read_only(e):
                raise
            self._read_only.failed(describe(e))
            return False
        self._read_only.worked()
        return True

    async def lost(self) -> str:
        """Return, with the reason, when this manager can no longer prove it holds the lock."""
        assert self._connection is not None, "acquire() first"
        every_s = self.timeout_s / 4
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._doubted.wait(), every_s)
            self._doubted.clear()
            try:
                await asyncio.wait_for(leader.still_here(self._connection, self.name), self.timeout_s / 2)
            except TimeoutError:
                return f"the leader lock's session got no answer from PostgreSQL within {self.timeout_s / 2:.1f}s"
            except Exception as e:  # noqa: BLE001 - any failure: the lock may be gone
                return f"the leader lock's session failed, or PostgreSQL ended it ({describe(e)})"

    def doubt(self) -> None:
        """The state side's database failed (a PostgreSQL switchover drops every connection,
        the lock's too): check the lock now, not a quarter of the timeout later, so that a
        leader that lost it stops before another takes it and works beside it."""
        self._doubted.set()

    async def release(self) -> None:
        """Give up the lock (its connection closed, or dropped if it cannot be)."""
        STATE_LEADER.set(0)
        await self._drop()

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        with contextlib.suppress(Exception):
            await connection.invalidate()
        with contextlib.suppress(Exception):
            await connection.close()
