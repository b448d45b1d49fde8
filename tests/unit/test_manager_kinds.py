"""``manager.kinds``: new observers validated against the kinds the services announce."""

from __future__ import annotations

import pytest

from manager.errors import Invalid, Unavailable
from manager.kinds import KindCatalog, NewObserver, OfferedKind, validate
from shared.kinds import BUILTIN_KINDS
from shared.messages import (
    KindInfo,
    RetryPolicy,
)


def _catalog() -> KindCatalog:
    echo = KindInfo(
        name="echo",
        args_schema={
            "type": "object",
            "properties": {"message": {"type": "string", "minLength": 1}},
            "required": ["message"],
            "additionalProperties": False,
        },
    )
    kinds = {"echo": OfferedKind(echo, {"default"}, 1), "ticker": OfferedKind(BUILTIN_KINDS["ticker"].info())}
    return KindCatalog(kinds, {"default", "gpu"})


def test_new_observers_are_validated_against_the_announced_kinds() -> None:
    catalog, default = _catalog(), RetryPolicy()
    ok = validate(NewObserver("a", "echo", {"message": "hi"}, retry={"max_attempts": None}), catalog, default)
    assert ok.retry is not None and ok.retry["max_attempts"] is None and ok.retry["factor"] == default.factor
    with pytest.raises(Invalid, match="message"):
        validate(NewObserver("a", "echo", {}), catalog, default)
    with pytest.raises(Invalid, match="unknown observer kind 'nope'"):
        validate(NewObserver("a", "nope", {}), catalog, default)
    with pytest.raises(Invalid, match="no live service of pool 'gpu' offers kind 'echo'"):
        validate(NewObserver("a", "echo", {"message": "x"}, pool="gpu"), catalog, default)
    with pytest.raises(Unavailable, match="no live observer service serves pool 'other'"):
        validate(NewObserver("a", "ticker", {}, pool="other"), catalog, default)
    with pytest.raises(Invalid, match=r"retry\.factor"):
        validate(NewObserver("a", "ticker", {}, retry={"factor": 0.5}), catalog, default)
    with pytest.raises(Invalid, match="interval_s"):
        validate(NewObserver("a", "ticker", {"interval_s": 0}), catalog, default)


def test_a_kind_that_pins_its_observers_pins_them_unless_the_create_says_otherwise() -> None:
    catalog, default = _catalog(), RetryPolicy()
    sticky = KindInfo(name="sticky", rebalance=False, args_schema={"type": "object"})
    catalog.kinds["sticky"] = OfferedKind(sticky, {"default"}, 1)
    assert validate(NewObserver("a", "sticky", {}), catalog, default).rebalance is False
    assert validate(NewObserver("a", "sticky", {}, rebalance=True), catalog, default).rebalance is True
    assert validate(NewObserver("a", "echo", {"message": "x"}), catalog, default).rebalance is True
    assert validate(NewObserver("a", "echo", {"message": "x"}, rebalance=False), catalog, default).rebalance is False


def test_args_must_suit_every_schema_announced_in_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service narrows ``periodic`` to its ORCH_PERIODIC_MODULES; any service of the pool may
    take the start, so the manager holds args to each schema announced there."""
    periodic = BUILTIN_KINDS["periodic"]
    monkeypatch.setenv("ORCH_PERIODIC_MODULES", "")
    calls_nothing = periodic.announced_info()
    monkeypatch.setenv("ORCH_PERIODIC_MODULES", "myjobs")
    calls_myjobs = periodic.announced_info()
    offered = OfferedKind(calls_myjobs)
    offered.announced_by(["jobs", "mixed"], calls_myjobs)
    offered.announced_by(["mixed", "strict"], calls_nothing)
    catalog, default = KindCatalog({"periodic": offered}, {"jobs", "mixed", "strict"}), RetryPolicy()

    def create(function: str, pool: str) -> NewObserver:
        return validate(NewObserver("p", "periodic", {"function": function}, pool=pool), catalog, default)

    assert create("myjobs.daily:run", "jobs").args["function"] == "myjobs.daily:run"
    with pytest.raises(
        Invalid, match=r"function: only .* ORCH_PERIODIC_MODULES may be called: myjobs \(got 'os:system'\)"
    ):
        create("os:system", "jobs")
    for pool in ("mixed", "strict"):
        with pytest.raises(Invalid, match="function: this service calls no function: ORCH_PERIODIC_MODULES is unset"):
            create("myjobs.daily:run", pool)
    with pytest.raises(Invalid, match="interval_s"):  # the built-in's own model still answers first
        validate(NewObserver("p", "periodic", {"function": "myjobs:f", "interval_s": 0}, pool="jobs"), catalog, default)
