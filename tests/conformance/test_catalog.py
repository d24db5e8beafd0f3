"""The catalogue suite: OpenEnv's own environments, served by ``corral serve`` in every form.

For each release (``openenv-core`` 0.3.0, ``openenv`` 0.10.0; a cached virtualenv each,
with the environments' dependencies, see ``venvs.py``) and each environment of
:data:`~tests.conformance.catalog.CATALOG`, the environment's own client plays a
fixed-seed episode under OpenEnv's server and under ``corral serve`` of each form
(directory, ``module:app``, ``module:Class``): the observations must be equal, or corral
must refuse the form naming the one that works. OpenEnv's own server-driving tests run
against ``corral serve`` too, and corral must fail none that OpenEnv's server passes.

The environments' sources come from a checkout of OpenEnv named by
``$CORRAL_OPENENV_SRC``; these tests run with ``--long`` (``make test-long``) and record
their outcome in ``catalog_results.json``, from which docs/openenv.md's table is made
(``python -m tests.conformance.catalog``); :func:`test_the_docs_table_is_the_last_run`
(in ``make test``) keeps the two from drifting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.conformance.catalog import (
    CATALOG,
    FORMS,
    RELEASES,
    UPSTREAM_TESTS,
    CatalogEnv,
    docs_table,
    read_results,
    record,
    requirements,
    source,
)
from tests.conformance.venvs import REPO, ensure, peer_env

HERE = Path(__file__).parent


def _long(request: pytest.FixtureRequest) -> Path:
    if not request.config.getoption("--long"):
        pytest.skip("the catalogue suite runs with --long (make test-long)")
    src = source()
    if src is None:
        pytest.skip("set $CORRAL_OPENENV_SRC to a checkout of OpenEnv's repository")
    return src


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("env", CATALOG, ids=lambda e: e.name)
def test_every_form_plays_the_episode_openenv_plays(
    request: pytest.FixtureRequest, release: str, env: CatalogEnv, tmp_path: Path
) -> None:
    src = _long(request)
    python = ensure(release, requirements())
    spec: dict[str, Any] = {
        "src": str(src),
        "name": env.name,
        "client": env.client,
        "action": env.action,
        "reset": env.reset,
        "actions": env.actions,
        "deterministic": env.deterministic,
        "targets": {
            form: str(src / "envs" / env.name) if form == "directory" else env.reference(form)
            for form in FORMS
        },
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run(
        [str(python), str(HERE / "catalog_driver.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=peer_env(python, gradio=True),
        cwd=HERE,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    outcome = json.loads(done.stdout)
    record(release, env.name, {form: outcome[form] for form in FORMS})
    allowed = ("equal", "same-shape", "refused", "openenv-fails")
    bad = {f: o for f, o in outcome.items() if f in FORMS and o["status"] not in allowed}
    assert not bad, json.dumps(bad, indent=1)


_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors)")


def _pytest(python: Path, src: Path, corral: bool) -> tuple[dict[str, int], set[str]]:
    # The plugin by its own name: OpenEnv's checkout has a tests/ of its own.
    command = [str(python), "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider"]
    command += ["-p", "upstream_plugin", *[str(src / t) for t in UPSTREAM_TESTS]]
    env = peer_env(python, gradio=True)
    env["CORRAL_UPSTREAM_SERVER"] = "corral" if corral else "openenv"
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(HERE), str(src)])
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500, env=env, cwd=src)
    counts = {kind.rstrip("s"): int(n) for n, kind in _SUMMARY.findall(done.stdout[-400:])}
    failed = set(re.findall(r"^FAILED (\S+)", done.stdout, re.M))
    return counts, failed


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES)
def test_openenvs_own_tests_pass_against_corral_serve(
    request: pytest.FixtureRequest, release: str
) -> None:
    src = _long(request)
    python = ensure(release, requirements())
    theirs, their_failures = _pytest(python, src, corral=False)
    ours, our_failures = _pytest(python, src, corral=True)
    record(
        release,
        "upstream",
        {
            "openenv": theirs,
            "corral": ours,
            "corral_only_failures": sorted(our_failures - their_failures),
        },
    )
    assert ours.get("passed", 0) > 0, ours
    assert our_failures <= their_failures, sorted(our_failures - their_failures)


def test_the_docs_table_is_the_last_run() -> None:
    """docs/openenv.md's catalogue table is the one the last catalogue run made, and that
    run covered every environment, form and release."""
    results = read_results()
    for release in RELEASES:
        for env in CATALOG:
            assert set(results.get(release, {}).get(env.name, {})) == set(FORMS), (
                f"{release} {env.name}: run `make test-long` with $CORRAL_OPENENV_SRC set"
            )
    docs = (REPO / "docs" / "openenv.md").read_text()
    assert docs_table(results) in docs, (
        "docs/openenv.md's catalogue table differs from catalog_results.json: "
        "run `python -m tests.conformance.catalog`"
    )
