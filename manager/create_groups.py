"""Group commit of single creates (issue 17).

Alone, each ``POST /api/observers`` is a transaction under its pool's create lock (the
capacity check must see every create before it), then a confirmed publish, then a
transaction that marks its start published. With many clients the lock is the limit, because
the locked section spans three round trips and each waits behind the API loop's other
requests (figures: docs/design.md, "Where the time goes").

So concurrent single creates share that work. The first runs at once, as a group of one;
the creates that arrive while a group runs wait and then go together as one bulk create:
one lock, one insert, one batch of confirmed publishes, one delete of pending starts. Nobody
waits for a timer, so a lone create is as fast as without groups.

Each request keeps the answer it would have had alone:

* it is validated alone before it joins a group, so bad input gets its own 4xx at once;
* a group whose create hits a name conflict (a name taken, or two requests of the group
  with one name) is split in halves, each tried as a group, earlier half first, down to the
  request that conflicts, which gets its own 409: one taken name among 64 costs 13
  transactions, not the 65 of running each alone;
* a group that a pool cannot take (``NoCapacity``) is split, and each of its creates runs
  alone: each gets its own 201 or 503 (halves would try every part of a full pool's share
  again, level by level);
* any other failure (the broker refusing the starts, the database unreachable) would have
  refused each of them alone too, and is every request's answer;
* a request whose client is gone before its group starts creates nothing; once its group
  has started, it is created like any request whose answer was lost on the way.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from manager.errors import Conflict, NoCapacity
from manager.metrics import API_CREATE_GROUP, API_CREATES_WAITING
from shared import tracing

if TYPE_CHECKING:
    from manager.create_result import CreatedObserver
    from manager.kinds import NewObserver

CreateMany = Callable[[list["NewObserver"]], Awaitable[list["CreatedObserver"]]]
Waiting = tuple["NewObserver", "asyncio.Future[CreatedObserver]"]

# A bulk request's largest size: a group is never larger than one.
LARGEST_GROUP = 1000


class CreateGroups:
    def __init__(self, create_many: CreateMany, largest: int = LARGEST_GROUP) -> None:
        self._create_many = create_many
        self._largest = largest
        self._waiting: list[Waiting] = []
        # The task that runs groups while creates are waiting (None when there are none). It
        # is not any request's task: a client that goes away must not cancel the others'.
        self._runner: asyncio.Task[None] | None = None
        # While traced: the context of each waiting request (by its future), for its group's
        # publish to be a child of a request of the group, not of the one that began the runner.
        self._contexts: dict[asyncio.Future[CreatedObserver], contextvars.Context] = {}

    async def create(self, spec: NewObserver) -> CreatedObserver:
        future: asyncio.Future[CreatedObserver] = asyncio.get_running_loop().create_future()
        self._waiting.append((spec, future))
        if tracing.active():
            self._contexts[future] = contextvars.copy_context()
        API_CREATES_WAITING.set(len(self._waiting))
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        try:
            while self._waiting:
                taken, self._waiting = self._waiting[: self._largest], self._waiting[self._largest :]
                API_CREATES_WAITING.set(len(self._waiting))
                group = [(spec, future) for spec, future in taken if not future.done()]  # done: cancelled
                if group:
                    API_CREATE_GROUP.observe(len(group))
                    await self._create_in_context(group)
        finally:
            self._runner = None
            self._contexts.clear()
            for _, future in self._waiting:  # only if this task was cancelled (shutdown)
                future.cancel()
            self._waiting = []
            API_CREATES_WAITING.set(0)

    async def _create_in_context(self, group: list[Waiting]) -> None:
        """``_create``, in the context of the group's first request while traced."""
        contexts = [self._contexts.pop(future, None) for _, future in group]
        if contexts[0] is None:
            await self._create(group)
            return
        await asyncio.create_task(self._create(group), context=contexts[0])

    async def _create(self, group: list[Waiting]) -> None:
        try:
            created = await self._create_many([spec for spec, _ in group])
        except (Conflict, NoCapacity) as e:
            if len(group) == 1:
                _settle(group, e)
                return
            if isinstance(e, NoCapacity):  # which pool? Each alone says.
                await asyncio.gather(*(self._create([w]) for w in group if not w[1].done()))
                return
            half = len(group) // 2  # whose name? The halves say, the earlier one first.
            for part in (group[:half], group[half:]):
                waiting = [w for w in part if not w[1].done()]
                if waiting:
                    await self._create(waiting)
        except asyncio.CancelledError:
            for _, future in group:
                future.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - not swallowed: each request raises it
            _settle(group, e)
        else:
            for (_, future), row in zip(group, created, strict=True):
                if not future.done():
                    future.set_result(row)


def _settle(group: list[Waiting], error: Exception) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(error)
