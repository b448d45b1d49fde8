"""The settings (``settings`` of ``shared``, ``manager`` and ``observer_service``): pools parsed
and bad names refused, the AMQP heartbeat added to a URL, ``workers=auto`` resolved, TLS files
checked and used."""

from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import quote

import pytest
from pydantic import ValidationError

from manager.settings import ManagerSettings
from observer_service.capacity import sized
from observer_service.settings import ServiceSettings
from shared.settings import amqp_url_with_heartbeat


def test_settings_parse_pools_and_reject_bad_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_POOLS", "default, gpu ,io")
    assert ServiceSettings().pools == ["default", "gpu", "io"]
    monkeypatch.setenv("ORCH_POOLS", "bad pool!")
    with pytest.raises(ValidationError, match="pools"):
        ServiceSettings()


def test_several_node_urls_mean_quorum_queues_unless_classic_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A classic queue dies with its node: on a cluster the durable queues are quorum by
    default (issue 65), on one node classic; an explicit choice wins either way."""
    monkeypatch.delenv("ORCH_QUEUE_TYPE", raising=False)
    monkeypatch.delenv("ORCH_AMQP_URLS", raising=False)
    for settings in (ServiceSettings, ManagerSettings):
        assert settings().queue_type == "classic"
        monkeypatch.setenv("ORCH_AMQP_URLS", "amqp://a:5672/")
        assert settings().queue_type == "classic"
        monkeypatch.setenv("ORCH_AMQP_URLS", "amqp://a:5672/,amqp://b:5672/")
        assert settings().queue_type == "quorum"
        monkeypatch.setenv("ORCH_QUEUE_TYPE", "classic")
        assert settings().queue_type == "classic"
        monkeypatch.delenv("ORCH_QUEUE_TYPE")
        monkeypatch.delenv("ORCH_AMQP_URLS")


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


def test_broker_tls_files_go_into_every_node_url_and_need_amqps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = tmp_path / "my ca.pem"
    ca.write_text("x")
    monkeypatch.setenv("ORCH_AMQP_URLS", "amqps://u:p@n1:5671/v, amqps://u:p@n2:5671/v?x=1")
    monkeypatch.setenv("ORCH_AMQP_CA_FILE", str(ca))
    urls = ServiceSettings().broker_urls()
    assert urls == [
        f"amqps://u:p@n1:5671/v?cafile={quote(str(ca))}",
        f"amqps://u:p@n2:5671/v?x=1&cafile={quote(str(ca))}",
    ]
    monkeypatch.setenv("ORCH_AMQP_URLS", "amqps://u:p@n1:5671/v,amqp://u:p@n2:5672/v")
    with pytest.raises(ValidationError, match="not amqps://"):
        ServiceSettings()
    monkeypatch.delenv("ORCH_AMQP_URLS")
    monkeypatch.setenv("ORCH_AMQP_CA_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ValidationError, match="cannot read"):
        ServiceSettings()


def test_database_tls_verifies_and_a_client_certificate_needs_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ManagerSettings().database_tls_context() is None
    monkeypatch.setenv("ORCH_DATABASE_TLS", "true")
    context = ManagerSettings().database_tls_context()
    assert context is not None and context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    monkeypatch.delenv("ORCH_DATABASE_TLS")
    monkeypatch.setenv("ORCH_DATABASE_CERT_FILE", __file__)
    with pytest.raises(ValidationError, match="TLS is off"):
        ManagerSettings()
