"""``corral validate --url``: passes against conforming servers, names what is broken."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.broken_servers import bad_corral_app, sloppy_app, unflattened_app
from tests.support.peers import AppThread, openenv_server
from tests.support.servers import running
from typer.testing import CliRunner

from corral.cli.main import app
from corral.cli.validate import local
from corral.cli.validate.report import Check, Report, Status
from corral.envs.echo import EchoEnv
from corral.envs.wordle import WordleEnv
from corral.server import create_app

runner = CliRunner()


def validate(url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    # Each check's deadline: a margin a loaded 2-core machine meets (at 5 s, a check of a
    # conforming server failed under a load of 15); no test here waits for one to pass.
    result = runner.invoke(app, ["validate", "--url", url, "--json", "--timeout", "30", *extra])
    assert result.output.strip(), result
    return result.exit_code, json.loads(result.output)


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {check["id"]: check["status"] for check in report["checks"]}


def details(report: dict[str, Any]) -> dict[str, str]:
    return {check["id"]: check["detail"] for check in report["checks"]}


# -- conforming servers --------------------------------------------------------------


def test_a_corral_server_passes_both_protocols():
    with running(EchoEnv, max_sessions=2, max_frame_bytes=4096) as srv:
        code, report = validate(srv.url)
    assert code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert report["passed"] is True
    assert report["protocols"] == {"corral": True, "openenv": True}
    got = statuses(report)
    must_pass = [
        "http.openapi",
        "http.schema",
        "openenv.http.step",
        "openenv.http.step_invalid",
        "openenv.ws.step",
        "openenv.ws.INVALID_JSON",
        "openenv.ws.UNKNOWN_TYPE",
        "openenv.ws.VALIDATION_ERROR",
        "openenv.ws.close",
        "openenv.ws.CAPACITY_REACHED",
        "corral.handshake",
        "corral.contract",
        "corral.episode",
        "corral.snapshot",
        "corral.RESET_REQUIRED",
        "corral.INVALID_ACTION",
        "corral.SESSION_LOST",
        "corral.FRAME_TOO_LARGE",
        "corral.CAPACITY_REACHED",
    ]
    assert {k: got[k] for k in must_pass} == dict.fromkeys(must_pass, "pass")
    assert set(got.values()) == {"pass"}


def test_wordle_passes_with_an_action_taken_from_the_schema_examples():
    with running(WordleEnv) as srv:
        code, report = validate(srv.url)
    assert code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert "synthesized action {'guess': 'crane'}" in details(report)["http.schema"]
    assert statuses(report)["corral.CAPACITY_REACHED"] == "skip"  # 1024 sessions: not probed


def test_the_snapshot_check_is_skipped_without_snapshots_and_fails_a_broken_one():
    from tests.support.snapshot_envs import ForgetfulTallyEnv, NoSnapshotEnv, TallyEnv

    with running(NoSnapshotEnv) as plain, running(ForgetfulTallyEnv) as broken:
        _, skipped = validate(plain.url)
        _, failed = validate(broken.url, "--action", '{"add": 1}')
    assert statuses(skipped)["corral.snapshot"] == "skip"
    assert details(skipped)["corral.snapshot"].startswith("not supported: tally declares no")
    assert statuses(failed)["corral.snapshot"] == "fail"
    assert "step 1 after the restore differs" in details(failed)["corral.snapshot"]
    with running(TallyEnv) as good:
        _, passed = validate(good.url, "--action", '{"add": 1}')
    assert statuses(passed)["corral.snapshot"] == "pass"
    assert "3 more step(s) identical" in details(passed)["corral.snapshot"]


def test_a_corral_only_server_passes_as_corral():
    with AppThread(create_app(EchoEnv, openenv=False)) as url:
        code, report = validate(url)
    assert code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert report["protocols"] == {"corral": True, "openenv": False}
    assert not any(check["protocol"] == "openenv" for check in report["checks"])


@pytest.fixture(scope="module")
def openenv_url() -> Iterator[str]:
    with openenv_server(max_envs=2) as url:
        yield url


def test_a_real_openenv_server_passes_the_openenv_checks(openenv_url):
    code, report = validate(openenv_url)
    assert code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert report["protocols"] == {"corral": False, "openenv": True}
    got = statuses(report)
    assert got["openenv.ws.CAPACITY_REACHED"] == "pass"
    assert got["openenv.ws.VALIDATION_ERROR"] == "pass"
    assert got["http.ready"] == "skip"


def test_the_table_output(openenv_url):
    result = runner.invoke(app, ["validate", "--url", openenv_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "openenv.ws.reset" in result.output and "protocols: openenv" in result.output
    assert "passed" in result.output


# -- broken servers ------------------------------------------------------------------


def test_unflattened_observations_and_wrong_codes_fail():
    with AppThread(unflattened_app()) as url:
        code, report = validate(url)
    assert code == 1 and report["passed"] is False
    got, why = statuses(report), details(report)
    assert got["openenv.ws.reset"] == "fail"
    assert why["openenv.ws.reset"] == "reset reply: data has no 'observation' object"
    assert got["openenv.ws.INVALID_JSON"] == "fail"
    assert why["openenv.ws.INVALID_JSON"] == "expected code INVALID_JSON, got 'EXECUTION_ERROR'"
    assert got["corral.episode"] == "pass" and got["openenv.http.reset"] == "pass"


def test_sloppy_http_and_dropped_sessions_fail():
    with AppThread(sloppy_app()) as url:
        result = runner.invoke(app, ["validate", "--url", url], env={"COLUMNS": "200"})
        code, report = validate(url)
    assert result.exit_code == 1
    assert "FAILED http.health:" in result.output
    assert code == 1
    got, why = statuses(report), details(report)
    assert "info.version is '2.0.0'" in why["http.openapi"]
    assert (
        why["http.health"]
        == "GET /health must return {\"status\": \"healthy\"}, got {'status': 'ok'}"
    )
    assert why["http.schema"] == "GET /schema: 'state' is not an object"
    assert got["openenv.ws.UNKNOWN_TYPE"] == "fail"
    assert "closed the connection" in why["openenv.ws.UNKNOWN_TYPE"]
    assert report["protocols"] == {"corral": False, "openenv": True}


def test_a_broken_corral_handshake_fails():
    with AppThread(bad_corral_app()) as url:
        code, report = validate(url)
    assert code == 1
    assert report["protocols"] == {"corral": True, "openenv": False}
    why = details(report)
    assert why["corral.handshake"] == "welcome.protocol is not corral/1"
    assert why["corral.UNKNOWN_TYPE"] == "expected UNKNOWN_TYPE, got 'BAD_MESSAGE'"
    assert why["corral.BAD_MESSAGE"].startswith("the error does not echo request id")


def test_nothing_listening_on_ws_fails_detection():
    from starlette.applications import Starlette

    with AppThread(Starlette()) as url:
        code, report = validate(url)
    assert code == 1
    assert statuses(report)["detect"] == "fail"


# -- arguments -----------------------------------------------------------------------


def test_argument_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Without --url, PATH (default: the current directory) is validated as an environment.
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["validate", "--static", "--json"])
    assert result.exit_code == 1 and "no corral.yaml or openenv.yaml" in result.output
    result = runner.invoke(app, ["validate", str(tmp_path), "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "not both" in result.output
    for bad in ("{nope", "[1]"):
        result = runner.invoke(app, ["validate", "--url", "http://127.0.0.1:9", "--action", bad])
        assert result.exit_code == 2


def test_a_given_action_is_checked_and_used():
    with running(EchoEnv) as srv:
        code, report = validate(srv.url, "--action", '{"message": "given"}')
        assert code == 0 and details(report)["http.schema"] == "using --action"
        code, report = validate(srv.url, "--action", '{"message": 1}')
    assert code == 1
    assert (
        "--action does not match the action schema: message: 1 is not of type 'string'"
        in (details(report)["http.schema"])
    )


def test_the_path_mode_gets_the_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    seen: dict[str, object] = {}

    def static(path: Path, options: local.LocalOptions) -> Report:
        seen.update(vars(options))
        check = Check("static.manifest", "static", "a manifest", Status.PASS, str(path))
        return Report(target=str(path), checks=[check])

    monkeypatch.setattr(local, "validate_environment", static)
    result = runner.invoke(app, ["validate", str(tmp_path), "--json", "--docker", "--seed", "3"])
    assert result.exit_code == 0
    assert json.loads(result.output)["checks"][0]["detail"] == str(tmp_path)
    assert seen["docker"] is True and seen["seed"] == 3 and seen["runtime"] is True


# -- one contract, both protocols (issue 33.4 / 33.5) ----------------------------------


def test_an_openenv_environment_served_by_corral_passes_both_protocols():
    """/schema and the corral/1 handshake publish the same contract for an OpenEnv
    environment, and corral's observations validate against it."""
    import httpx
    from tests.support.openenv_envs import CountEnv

    from corral.adapters.openenv_env import from_openenv
    from corral.client import AsyncEnvClient

    served = from_openenv(CountEnv)
    with running(served, max_sessions=2) as srv:
        code, report = validate(srv.url, "--action", '{"amount": 1}')
        schema = httpx.get(f"{srv.url}/schema").json()
        with AsyncEnvClient(srv.url).sync() as client:
            welcome = client.server_info["env"]
    assert code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert report["protocols"] == {"corral": True, "openenv": True}
    assert statuses(report)["corral.contract"] == "pass"
    assert schema["fingerprint"] == served.contract().fingerprint == welcome["fingerprint"]
    assert schema["observation"] == served.contract().schemas["observation"]


def test_a_null_top_level_metadata_does_not_hide_the_nested_one():
    """OpenEnv 0.10 sends ``"metadata": null`` beside the nested ``{}``: not a failure."""
    from corral.cli.validate.checks import Schemas
    from corral.cli.validate.openenv_checks import OpenEnvChecks

    checks = OpenEnvChecks("http://127.0.0.1:9")
    checks.schemas = Schemas(
        action={},
        observation={
            "type": "object",
            "properties": {"metadata": {"type": "object"}, "done": {"type": "boolean"}},
        },
        state={},
    )
    data = {"observation": {"metadata": {}}, "reward": None, "done": False, "metadata": None}
    assert checks._flat_observation(data, "reset")["metadata"] == {}
    kept = {**data, "metadata": {"k": 1}}
    assert checks._flat_observation(kept, "reset")["metadata"] == {"k": 1}
