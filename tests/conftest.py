"""Options of the whole suite: ``--long``, the hypothesis profiles, and the xdist groups.

``pytest`` runs every property test with the small ``default`` profile (20 examples each,
no per-example deadline: a loaded machine must not fail a test for being slow), so the
suite stays fast; ``pytest --long`` selects the ``long`` profile (200 examples each) and
the fault and fuzz suites' larger scale (``tests/faults/conftest.py``). A test that sets
``max_examples`` itself keeps it under both.

Under pytest-xdist (``make pytest`` runs ``-n 4 --dist loadgroup``) every test gets an
``xdist_group`` here, unless it names one itself (see :func:`xdist_group_of`).

Every process of the session, and every process it starts, runs without gradio and with
one OpenMP thread (see :func:`pytest_configure`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The fault suites' figures report runs where the summary is printed (the xdist controller);
# the xdist groups reach the controller's scheduler through tests/support/xdist_groups.py.
pytest_plugins = ["tests.support.figures", "tests.support.cpu_report"]
if importlib.util.find_spec("xdist") is not None:
    pytest_plugins.append("tests.support.xdist_groups")

_RELAXED = {
    "deadline": None,
    # Drawing whole model classes is slow by design, and slower on a busy machine.
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("default", max_examples=20, **_RELAXED)
settings.register_profile("long", max_examples=200, **_RELAXED)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        help="run the property, fault and fuzz suites at full size (hypothesis profile 'long')",
    )


WITHOUT_GRADIO = Path(__file__).with_name("support") / "without_gradio"
"""A ``gradio`` that cannot be imported (see its docstring)."""


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("long" if config.getoption("--long") else "default")
    # openenv-core imports gradio for its web interface, which no test enables: ~4 s of CPU
    # in every process that imports openenv (the xdist workers, and the servers of OpenEnv
    # environments they start). Left out here, in the path of this process and, through
    # PYTHONPATH, of its children; an interface nobody enables reads nothing of it.
    if str(WITHOUT_GRADIO) not in sys.path:
        sys.path.insert(0, str(WITHOUT_GRADIO))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(WITHOUT_GRADIO) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WITHOUT_GRADIO), *paths]))
    os.environ.pop("ENABLE_WEB_INTERFACE", None)
    # torch (SB3, TRL) and OpenBLAS start a thread per core for each operation, and an
    # idle one spins before it sleeps: with more test processes than cores those threads
    # only burn CPU the others need (a README PPO block: 17 CPU-s with them, 6 without).
    # One thread in every test process and its children, unless the caller chose.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# A test needing one of these machine-wide resources runs on the worker that holds all
# of them: the Docker engine's images and containers (session fixtures build the echo
# image once; tests build and remove fixed tags), the local Ray cluster, and Chromium
# (one browser per session is enough, and it is the heaviest process of the suite).
# The tests building the scaffold's fixed tag corral-demo_env:0.1.0 name a group of their
# own (tests.support.docker_fixtures.DEMO_IMAGE_GROUP): its builds and the docker group's
# are the two longest chains of the suite, and run on two workers side by side.
_RESOURCE_GROUPS = {
    "docker": ("docker_client", "base_image", "echo_image", "scaffold_image"),
    "ray": ("ray_cluster",),
    "browser": ("browser",),
}
_SHARED_SCOPES = ("package", "module", "class")


def xdist_group_of(item: pytest.Item) -> str | None:
    """The group ``item`` runs in under ``--dist loadgroup``, or None to go anywhere.

    A machine-wide resource's group (:data:`_RESOURCE_GROUPS`, by marker or fixture);
    else its file when it uses a fixture shared by a module or class (a server per module
    is started once, on one worker); else none: a self-contained test is balanced alone.
    """
    fixtures: set[str] = set(getattr(item, "fixturenames", ()))
    for group, names in _RESOURCE_GROUPS.items():
        if item.get_closest_marker(group) is not None or fixtures.intersection(names):
            return group
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for defs in info.name2fixturedefs.values():
            if any(d.scope in _SHARED_SCOPES for d in defs):
                return item.nodeid.split("::", 1)[0]
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    if item.get_closest_marker("xdist_group") is None:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session", autouse=True)
def _sb3_logs_in_tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Stable-Baselines3's default logger makes ``$TMPDIR/SB3-<date>`` on every
    ``learn()`` (in this process and in the snippets' children): point it into the
    session's temporary directory, which pytest cleans up."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
        yield
