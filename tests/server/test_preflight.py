"""An environment's preflight: the server reports its facts, or refuses to start (30.16).

The coding environment's preflight is its sandbox mode: a server that would run agents'
code under the weak ``rlimits`` mode without being told it may does not start.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tests.support.servers import running

from corral.client.local_server import LocalServer
from corral.envs.echo import EchoEnv
from corral.sandbox import DEFAULT_UID_RANGE, SandboxMode
from corral.sandbox.probe import ALLOW_WEAK_ENV, default_python, probe


async def test_health_and_metrics_say_the_sandbox_mode() -> None:
    # A server process of its own: the mode reported is the weakest resolved in the
    # process, and this test process may have resolved rlimits for other tests.
    server = LocalServer("corral.envs.coding:CodingEnv", startup_timeout=120)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            health = (await http.get("/health")).json()
            metrics = (await http.get("/metrics")).text
    finally:
        await server.stop()
    mode = health["sandbox"]
    assert mode in ("bwrap", "unshare")  # a namespace mode works on these machines
    assert health["sandbox_strategy"]
    assert f'corral_env_info{{sandbox="{mode}",' in metrics


def test_an_env_without_a_preflight_reports_nothing_more() -> None:
    with running(EchoEnv) as server:
        assert httpx.get(f"{server.url}/health", timeout=10).json() == {"status": "healthy"}
        assert "corral_env_info" not in httpx.get(f"{server.url}/metrics", timeout=10).text


def serve_without_namespaces(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """``corral serve`` of the coding env on a PATH with neither bwrap nor unshare: only
    the rlimits mode can work, as in the hardened Pod."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k != ALLOW_WEAK_ENV}
    return subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "corral.envs.coding:CodingEnv",
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(tmp_path / "url")],
        env={**inherited, "PATH": str(empty), **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_server_refuses_to_start_in_the_weak_mode_unless_allowed(tmp_path: Path) -> None:
    refused = serve_without_namespaces(tmp_path)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 1, err
    assert "the server does not start" in err and ALLOW_WEAK_ENV in err
    assert "Traceback" not in err and not (tmp_path / "url").exists()


def test_allowed_explicitly_it_starts_and_says_rlimits(tmp_path: Path) -> None:
    weak = probe(SandboxMode.RLIMITS, default_python(), DEFAULT_UID_RANGE)
    if isinstance(weak, str):
        pytest.skip(f"the rlimits mode itself cannot run here: {weak}")
    server = serve_without_namespaces(tmp_path, **{ALLOW_WEAK_ENV: "1"})
    try:
        url_file = tmp_path / "url"
        for _ in range(1200):
            if url_file.exists() and url_file.read_text().strip():
                break
            if server.poll() is not None:
                pytest.fail(f"the server exited: {server.communicate()[1]}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(0.1)  # an exit ends the wait at once
        url = url_file.read_text().strip()
        assert httpx.get(f"{url}/health", timeout=10).json()["sandbox"] == "rlimits"
    finally:
        server.terminate()
        server.communicate(timeout=60)
