"""``shared/errors.py``'s docstring draws the error hierarchy: every class of the module is in
it, under its own base (issue 64: ``BrokerRefused`` was missing)."""

from __future__ import annotations

import inspect
import re

from shared import errors


def test_the_drawn_tree_is_the_modules_hierarchy() -> None:
    drawn: dict[str, int] = {}  # class name -> depth in the drawing
    parents: dict[str, str] = {}
    stack: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^([│ ]*)(?:[├└]── )?([A-Z][A-Za-z]+)\b", line)
        if not match or not match.group(2).endswith(("Error", "Lost", "Kind", "Unavailable", "Refused", "Denied")):
            continue
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        name = match.group(2)
        drawn[name] = depth
        del stack[depth:]
        if stack:
            parents[name] = stack[-1]
        stack.append(name)
    classes = {name: cls for name, cls in vars(errors).items() if inspect.isclass(cls) and issubclass(cls, Exception)}
    assert set(drawn) == set(classes)
    for name, parent in parents.items():
        assert classes[name].__bases__ == (classes[parent],), name
