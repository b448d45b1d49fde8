"""Pointers stay true: what a comment, a docstring or a doc names exists (issue 64, item 4).

* a path of the repository (``manager/state/rules.py``, ``docs/sizing.md``);
* a results file a figure is quoted from (``cluster-20261129T104523Z.json``): committed under
  ``bench/results/``, or the figure cannot be checked;
* a section of a doc (``docs/design.md, "Even load"``, ``[x](design.md#even-load)``);
* a variable (``ORCH_...``): a setting, or one the code or the compose files read;
* nothing points outside the repository (the original design notes are not in it).

The diary (``docs/bench-history.md``) and the evidence files record what was true when they
were written: they may name files since moved, never the other way round.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

from manager.settings import ManagerSettings
from observer_service.settings import ServiceSettings
from tools import settings_doc

REPO = Path(__file__).resolve().parents[2]
HISTORY = ("docs/bench-history.md", "docs/evidence/")
TOP = "manager|observer_service|shared|tools|tests|bench|docs|deploy|migrations|cli|orchestrator_client|scripts"
PATH = re.compile(rf"(?<![\w./-])((?:{TOP})/[\w./-]*\w)(?![\w-]*[{{<*])")
RESULTS = re.compile(r"(?<![\w-])((?:[a-z][a-z-]*-)?\d{8}T\d{6}Z\.json)")
SECTION = re.compile(r"([\w/-]+\.md)`?,? \"([^\"]{2,80})\"")
ANCHOR = re.compile(r"\]\(([\w/.-]*\.md)#([\w-]+)\)")
VARIABLE = re.compile(r"\bORCH_[A-Z0-9_]*[A-Z0-9]\b")


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return tuple(out.split())


def texts(*suffixes: str) -> dict[str, str]:
    """Our own files (not the vendored ones or the history) by path, read."""
    return {
        f: (REPO / f).read_text(errors="replace")
        for f in tracked()
        if f.endswith(suffixes)
        and not f.startswith(("tests/vendor/", *HISTORY, "tests/unit/test_pointers.py"))  # this one's examples
        and (REPO / f).exists()
    }


def test_named_paths_exist() -> None:
    missing = [
        f"{f}: {p}"
        for f, text in texts(".py", ".md", ".yaml", ".yml", ".toml").items()
        for p in set(PATH.findall(text))
        if not (REPO / p.rstrip(".")).exists() and not (REPO / f"{p}.py").exists() and p != "tests/artifacts"
    ]
    assert not missing, "\n".join(sorted(missing))


def test_quoted_results_files_are_committed() -> None:
    committed = {Path(f).name for f in tracked() if f.startswith("bench/results/")}
    missing = [
        f"{f}: {name}"
        for f, text in texts(".py", ".md").items()
        if f != "tests/unit/test_bench_history.py"  # made-up names for the history tool's test
        for name in set(RESULTS.findall(text))
        if name not in committed
    ]
    assert not missing, "\n".join(sorted(missing))


def _sections(doc: str) -> str:
    """Where a section can be named from: its headings, bold leads and table rows."""
    lines = (REPO / doc).read_text().splitlines()
    return "\n".join(line for line in lines if line.startswith(("#", "**", "|", "* **")))


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip("# ").lower()).replace(" ", "-")


def test_named_sections_exist() -> None:
    missing = []
    for f, text in texts(".py", ".md").items():
        for doc, quoted in SECTION.findall(text):
            section = re.sub(r"\s*\n\s*#?\s*", " ", quoted)  # a comment wrapped over lines
            path = doc if "/" in doc else f"docs/{doc}"
            if "DESIGN.md" in doc:
                continue  # the next test
            if not (REPO / path).exists():
                missing.append(f"{f}: {doc} (no such file)")
            elif section.lower() not in _sections(path).lower():
                missing.append(f'{f}: {doc}, "{section}"')
        for doc, anchor in ANCHOR.findall(text):
            # Relative to the file, or to docs/ (settings' descriptions are rendered there).
            path = next((p for p in ((REPO / f).parent / doc, REPO / "docs" / doc) if p.exists()), REPO / doc)
            headings = [line for line in path.read_text().splitlines() if line.startswith("#")] if path.exists() else []
            if anchor not in {_slug(h) for h in headings}:
                missing.append(f"{f}: {doc}#{anchor}")
    assert not missing, "\n".join(sorted(missing))


def test_nothing_points_outside_the_repository() -> None:
    outside = [f for f, text in texts(".py", ".md").items() if re.search(r"(?<![\w/])DESIGN\.md", text)]
    assert not outside, f"name a section of docs/design.md instead of DESIGN.md (not in the repository): {outside}"


def test_named_variables_exist() -> None:
    known = {settings_doc.variable(n) for s in (ManagerSettings, ServiceSettings) for n in s.model_fields}
    code = texts(".py", ".yaml", ".yml")
    for text in code.values():  # read by the code itself (a quoted name) or by compose (${NAME})
        known |= set(re.findall(r"[\"'{](ORCH_[A-Z0-9_]*[A-Z0-9])[\"':}-]", text))
    known |= set(re.findall(r"export (ORCH_[A-Z0-9_]+)", (REPO / "Makefile").read_text()))
    unknown = [
        f"{f}: {name}"
        for f, text in (texts(".py", ".md", ".yaml", ".yml") | {"Makefile": (REPO / "Makefile").read_text()}).items()
        for name in set(VARIABLE.findall(text))
        if name not in known
    ]
    assert not unknown, "\n".join(sorted(unknown))
