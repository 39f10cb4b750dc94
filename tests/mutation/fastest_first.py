"""A pytest plugin for ``make mutate`` only (``scripts/mutate.py`` loads it with ``-p``): a
mutant's tests run fastest first, by the durations mutmut measured on the clean code.

mutmut stops a mutant's run at its first failing test (``-x``) and hands pytest the tests
that reach the mutated function in no particular order; most mutants are killed by almost
any of them, so a quick one first ends the run in a fraction of a second instead of after a
multi-region or race test of several seconds. A survivor still runs every test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# mutmut's record of the clean run, in the directory it runs the tests from (``mutants/``).
STATS = Path("mutmut-stats.json")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not STATS.exists():
        return  # mutmut's first, clean run: nothing measured yet
    durations: dict[str, float] = json.loads(STATS.read_text(encoding="utf-8"))["duration_by_test"]
    slowest = max(durations.values(), default=0.0)
    # A test not measured (new since the clean run) goes last: its cost is unknown.
    items.sort(key=lambda item: durations.get(item.nodeid, slowest + 1))
