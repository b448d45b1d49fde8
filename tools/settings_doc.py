"""``docs/configuration.md``, made from the settings' own field descriptions (one source).

    python -m tools.settings_doc           # print it
    python -m tools.settings_doc --write   # write docs/configuration.md

``tests/unit/test_settings_doc.py`` fails when the file and the settings differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from manager.settings import ManagerSettings
from observer_service.settings import ServiceSettings
from shared.settings import CommonSettings

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

_HEAD = """\
# Configuration

Every process reads `ORCH_*` environment variables. A value that does not validate stops the
process at start with one line naming the variable (exit status 2).

<!-- Made by `python -m tools.settings_doc --write` from the descriptions in settings.py of
shared/, manager/ and observer_service/: edit those, not this file
(tests/unit/test_settings_doc.py compares them). -->
"""

_SECTIONS: tuple[tuple[str, type[BaseSettings]], ...] = (
    ("Every process (manager and observer services)", CommonSettings),
    ("Observer services", ServiceSettings),
    ("Manager", ManagerSettings),
)


def variable(name: str) -> str:
    return f"ORCH_{name.upper()}"


def shown_default(info: FieldInfo) -> str:
    """The default as the table shows it: the field's own words (``shown_default``, for a
    default that is computed or means something else than it reads), or its value as code."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("shown_default"), str):
        return str(extra["shown_default"])
    value = info.get_default(call_default_factory=False)
    if value is None or value in ([], ()):
        return "unset"
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    elif isinstance(value, list | tuple):
        text = ",".join(map(str, value))
    else:
        text = str(value)
    return f"`{text}`"


def _own_fields(settings: type[BaseSettings]) -> dict[str, FieldInfo]:
    inherited = set().union(*(getattr(base, "model_fields", {}) for base in settings.__mro__[1:]))
    return {name: info for name, info in settings.model_fields.items() if name not in inherited}


def render() -> str:
    parts = [_HEAD]
    for title, settings in _SECTIONS:
        parts.append(f"\n## {title}\n\n| variable | default | meaning |\n|---|---|---|\n")
        for name, info in _own_fields(settings).items():
            if not info.description:
                raise ValueError(f"{settings.__name__}.{name} has no description")
            parts.append(f"| `{variable(name)}` | {shown_default(info)} | {info.description} |\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--write"]:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
