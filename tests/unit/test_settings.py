"""``shared.settings``: pools parsed and bad names refused, the AMQP heartbeat added to a URL,
``workers=auto`` resolved."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from observer_service.capacity import sized
from shared.settings import ServiceSettings, amqp_url_with_heartbeat


def test_settings_parse_pools_and_reject_bad_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_POOLS", "default, gpu ,io")
    assert ServiceSettings().pools == ["default", "gpu", "io"]
    monkeypatch.setenv("ORCH_POOLS", "bad pool!")
    with pytest.raises(ValidationError, match="pools"):
        ServiceSettings()


def test_amqp_heartbeat_is_added_unless_given() -> None:
    assert amqp_url_with_heartbeat("amqp://h/", 6) == "amqp://h/?heartbeat=6"
    assert amqp_url_with_heartbeat("amqp://h/?x=1", 6) == "amqp://h/?x=1&heartbeat=6"
    assert amqp_url_with_heartbeat("amqp://h/?heartbeat=9", 6) == "amqp://h/?heartbeat=9"


def test_workers_auto_is_resolved_to_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_WORKERS_COUNT", "auto")
    settings, capacity = sized(ServiceSettings())
    assert capacity is not None and settings.workers_count == capacity.workers >= 1
    assert 0 <= settings.process_slots <= settings.workers_count
    monkeypatch.setenv("ORCH_WORKERS_COUNT", "12")
    monkeypatch.setenv("ORCH_PROCESS_SLOTS", "3")
    assert sized(ServiceSettings()) == (ServiceSettings(), None)
    with pytest.raises(ValueError):
        ServiceSettings(workers_count=-5)
