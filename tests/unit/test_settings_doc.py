"""docs/configuration.md is made from the settings' own descriptions: they never drift."""

from __future__ import annotations

from pydantic_settings import BaseSettings

from manager.settings import ManagerSettings
from observer_service.settings import ServiceSettings
from tools import settings_doc


def test_the_configuration_doc_is_the_settings_own() -> None:
    assert settings_doc.DOC.read_text() == settings_doc.render(), (
        "docs/configuration.md differs from the settings classes: run `python -m tools.settings_doc --write`"
    )


def test_every_variable_is_in_the_doc_once() -> None:
    text = settings_doc.render()
    for settings in (ServiceSettings, ManagerSettings):
        assert issubclass(settings, BaseSettings)
        for name in settings.model_fields:
            assert text.count(f"| `{settings_doc.variable(name)}` |") == 1, name
