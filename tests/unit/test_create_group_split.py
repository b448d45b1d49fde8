"""How a group of single creates is split when its bulk create is refused
(``manager.create_groups``): pure logic on a real event loop, with a stand-in for the bulk
create that refuses as the manager's does. Each request gets the answer it would have had
alone; a name conflict is found by halves, not by running every member alone.

The behaviour against the real manager, broker and database is in
``tests/system/test_create_groups.py``."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from manager.create_groups import CreateGroups
from manager.errors import Conflict, NoCapacity
from manager.kinds import NewObserver
from shared.errors import BrokerUnavailable


class BulkCreate:
    """Creates all or nothing, as ``ObserverCommands.create_many`` does: a name live already
    or repeated in the batch is a ``Conflict``, more than ``room`` is ``NoCapacity``."""

    def __init__(self, taken: set[str], room: int = 1_000_000) -> None:
        self.taken = set(taken)
        self.room = room
        self.calls: list[int] = []  # the size of each batch asked for
        self.fail: Exception | None = None

    async def __call__(self, specs: list[NewObserver]) -> list[Any]:
        self.calls.append(len(specs))
        await asyncio.sleep(0)  # a round trip: later creates queue meanwhile
        names = [spec.name for spec in specs]
        if self.fail is not None:
            raise self.fail
        if len(set(names)) < len(names) or self.taken & set(names):
            raise Conflict("observer name(s) already used")
        if len(names) > self.room:
            raise NoCapacity("pool 'default' is full")
        self.taken |= set(names)
        self.room -= len(names)
        return [f"created {name}" for name in names]


def spec(name: str) -> NewObserver:
    return NewObserver(name=name, kind="ticker", args={})


async def create_together(groups: CreateGroups, names: list[str]) -> list[Any]:
    """Each name's answer: its row, or the error it was refused with. All arrive before the
    first group starts, so they go as one group."""
    answers = await asyncio.gather(*(groups.create(spec(name)) for name in names), return_exceptions=True)
    return cast(list[Any], answers)


async def test_one_taken_name_among_64_is_found_by_halves() -> None:
    bulk = BulkCreate(taken={"o-37"})
    names = [f"o-{i}" for i in range(64)]
    answers = await create_together(CreateGroups(bulk), names)
    assert isinstance(answers[37], Conflict)
    assert [a for i, a in enumerate(answers) if i != 37] == [f"created {n}" for n in names if n != "o-37"]
    # The group of 64, then two halves at each of six levels, the one with o-37 split first:
    # 13 bulk creates, not 1 + 64.
    assert bulk.calls == [64, 32, 32, 16, 8, 4, 4, 2, 1, 1, 2, 8, 16]


async def test_a_name_twice_in_a_group_is_created_once_and_refused_once() -> None:
    bulk = BulkCreate(taken=set())
    answers = await create_together(CreateGroups(bulk), ["a", "twin", "b", "c", "twin", "d"])
    assert answers[0] == "created a" and answers[2:4] == ["created b", "created c"] and answers[5] == "created d"
    assert sorted(isinstance(a, Conflict) for a in (answers[1], answers[4])) == [False, True]
    assert "created twin" in answers


async def test_a_group_past_a_full_pool_runs_each_alone() -> None:
    bulk = BulkCreate(taken=set(), room=5)
    answers = await create_together(CreateGroups(bulk), [f"o-{i}" for i in range(8)])
    assert sum(isinstance(a, str) for a in answers) == 5
    assert sum(isinstance(a, NoCapacity) for a in answers) == 3
    assert bulk.calls == [8] + [1] * 8


@pytest.mark.parametrize("size", [1, 5])
async def test_any_other_refusal_is_every_request_answer(size: int) -> None:
    bulk = BulkCreate(taken=set())
    bulk.fail = BrokerUnavailable("the broker did not confirm the starts")
    answers = await create_together(CreateGroups(bulk), [f"o-{i}" for i in range(size)])
    assert all(a is bulk.fail for a in answers)
    assert bulk.calls == [size]
