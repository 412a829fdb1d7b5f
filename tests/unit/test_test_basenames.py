"""Test modules need unique import names: outside a package (a folder with __init__.py)
pytest imports a module by its basename, and two of the same name stop the whole run at
collection."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        name, parent = path.stem, path.parent
        while (parent / "__init__.py").is_file():  # inside a package: its dotted name
            name, parent = f"{parent.name}.{name}", parent.parent
        seen[name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1 and not name.endswith("conftest")}
    assert not clashes, clashes
