"""Options of the whole suite: ``--long``, and the hypothesis profiles it selects.

``pytest`` runs every property test with the small ``default`` profile (20 examples each,
no per-example deadline: a loaded machine must not fail a test for being slow), so the
suite stays fast; ``pytest --long`` selects the ``long`` profile (200 examples each) and
the fault and fuzz suites' larger scale (``tests/faults/conftest.py``). A test that sets
``max_examples`` itself keeps it under both.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

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


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("long" if config.getoption("--long") else "default")
