"""Groups for ``pytest -n N --dist loadgroup``, chosen per test by ``tests/conftest.py``.

pytest-xdist 3.8 keeps a test's ``xdist_group`` by appending it to the node id, which pytest
9.2 no longer lets a plugin change (``Node.nodeid`` is read from a new attribute), so
under pytest 9.2 every test ran wherever it fell. Here the groups travel another way: each
worker writes a map of node id to group when it has collected (a file in a directory the
controller made), and the controller's scheduler (xdist's own per-scope one) reads the
map, so that a group is one unit of work on one worker. A test without a group is a unit
of its own. Loaded by ``tests/conftest.py`` when pytest-xdist is installed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

_INPUT_KEY = "corral_groups_dir"


def _controller_dir(config: pytest.Config) -> Path | None:
    path: Path | None = getattr(config, "_corral_groups_dir", None)
    return path


def pytest_configure(config: pytest.Config) -> None:
    is_worker = hasattr(config, "workerinput")
    if not is_worker and config.getoption("dist", "no") == "loadgroup":
        config._corral_groups_dir = Path(tempfile.mkdtemp(prefix="corral-xdist-groups-"))  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    path = _controller_dir(config)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def pytest_configure_node(node: Any) -> None:
    path = _controller_dir(node.config)
    if path is not None:
        node.workerinput[_INPUT_KEY] = str(path)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    where = getattr(config, "workerinput", {}).get(_INPUT_KEY)
    if where is None:
        return
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name"))
    worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
    partial = Path(where) / f"{worker}.json.partial"
    partial.write_text(json.dumps(groups))
    partial.replace(Path(where) / f"{worker}.json")  # whole or absent for the controller


class GroupScheduling(LoadScopeScheduling):
    """xdist's per-scope scheduling with the scope read from the workers' group maps."""

    def __init__(self, config: pytest.Config, log: Any, where: Path) -> None:
        super().__init__(config, log)
        self._where = where
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            # Called once every worker has reported its collection, so its map is written.
            maps = sorted(self._where.glob("*.json"))
            self._groups = json.loads(maps[0].read_text()) if maps else {}
        return self._groups.get(nodeid, nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    path = _controller_dir(config)
    if path is None:
        return None
    return GroupScheduling(config, log, path)
