"""docs/configuration.md is made from the settings' own descriptions: they never drift."""

from __future__ import annotations

from pydantic_settings import BaseSettings

from shared import settings_doc
from shared.settings import ManagerSettings, ServiceSettings


def test_the_configuration_doc_is_the_settings_own() -> None:
    assert settings_doc.DOC.read_text() == settings_doc.render(), (
        "docs/configuration.md differs from shared/settings.py: run `python -m shared.settings_doc --write`"
    )


def test_every_variable_is_in_the_doc_once() -> None:
    text = settings_doc.render()
    for settings in (ServiceSettings, ManagerSettings):
        assert issubclass(settings, BaseSettings)
        for name in settings.model_fields:
            assert text.count(f"| `{settings_doc.variable(name)}` |") == 1, name
