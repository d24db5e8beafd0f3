"""``corral serve --token-file``: the server requires the file's token on every route."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from corral.cli.main import app

REPO = Path(__file__).resolve().parents[2]


def test_serve_with_a_token_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("file-token-0123456789\n")
    port_file = tmp_path / "url"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_TOKEN")}
    env["PYTHONPATH"] = str(REPO)
    child = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "tests.support.envs:CounterEnv",
         "--port", "0", "--port-file", str(port_file), "--token-file", str(token_file)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        url = port_file.read_text()
        assert httpx.get(f"{url}/health", trust_env=False).status_code == 401
        headers = {"Authorization": "Bearer file-token-0123456789"}
        assert httpx.get(f"{url}/health", headers=headers, trust_env=False).status_code == 200
    finally:
        child.terminate()
        child.wait(10)


def test_unreadable_token_file_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(
        app, ["serve", "corral.envs.echo:EchoEnv", "--token-file", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2
    assert "cannot read the token file" in result.output
