"""``corral serve --fleet-key-file`` and ``$CORRAL_FLEET_KEY``: servers sharing the key
restore each other's signed snapshots; a short key is refused at start."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support.raw import RawPeer
from typer.testing import CliRunner

from corral.cli.main import app

REPO = Path(__file__).resolve().parents[2]
KEY = "fleet-key-" + "0123456789abcdef" * 2


@contextmanager
def serve(tmp_path: Path, name: str, *args: str, key_env: str | None = None) -> Iterator[str]:
    port_file = tmp_path / f"{name}.url"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = str(REPO)
    if key_env is not None:
        env["CORRAL_FLEET_KEY"] = key_env
    child = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "corral.envs.echo:EchoEnv",
         "--port", "0", "--port-file", str(port_file), *args],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stderr
            time.sleep(0.05)
        yield port_file.read_text()
    finally:
        child.terminate()
        child.wait(10)


async def test_servers_sharing_the_key_restore_each_others_snapshots(tmp_path: Path) -> None:
    key_file = tmp_path / "fleet.key"
    key_file.write_text(KEY + "\n")
    with ExitStack() as stack:
        from_file = stack.enter_context(serve(tmp_path, "a", "--fleet-key-file", str(key_file)))
        from_env = stack.enter_context(serve(tmp_path, "b", key_env=KEY))
        a, b = await RawPeer.open(from_file), await RawPeer.open(from_env)
        try:
            sid = await a.open_session()
            await a.request({"type": "reset", "session": sid, "seed": 1})
            await a.request({"type": "step", "session": sid, "action": {"message": "hi"}})
            reply = await a.request({"type": "snapshot", "session": sid})
            signed = reply["snapshot"]
            assert signed["sig"].startswith("hmac-sha256:")
            moved = await b.request({"type": "restore", "snapshot": signed})
            assert moved["type"] == "restored", moved
            assert moved["observation"]["echoed_message"] == "hi"
            forged = copy.deepcopy(signed)
            forged["snapshot"]["message"] = "bye"
            refused = await b.request({"type": "restore", "snapshot": forged})
            assert refused["code"] == "BAD_SNAPSHOT"
        finally:
            await a.close()
            await b.close()


def test_a_short_or_unreadable_key_is_a_clear_error(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    for path, message in (
        (short, "is 9 bytes long; use at least 32"),
        (tmp_path / "nope", "cannot read"),
    ):
        # Wide enough that the message, which names the temporary path, is on one line.
        result = CliRunner(env={"COLUMNS": "300"}).invoke(
            app, ["serve", "corral.envs.echo:EchoEnv", "--fleet-key-file", str(path)]
        )
        assert result.exit_code == 2 and message in result.output, result.output
