"""``corral serve PATH``: a manifest's environment, and the errors before anything is served."""

from __future__ import annotations

import socket
from pathlib import Path

from typer.testing import CliRunner

from corral.cli.main import app
from corral.cli.target import TargetKind, read_target

runner = CliRunner(env={"COLUMNS": "200"})


def test_a_directory_gives_the_manifest_and_its_root(echo_env: Path) -> None:
    chosen = read_target(str(echo_env))
    assert chosen.kind is TargetKind.DIRECTORY
    assert chosen.reference == "corral.envs.echo:EchoEnv"
    assert chosen.root == echo_env.resolve()
    assert chosen.manifest is not None and chosen.manifest.concurrency.max_sessions == 8
    by_file = read_target(str(echo_env / "corral.yaml"))
    assert by_file.manifest is not None and by_file.reference == chosen.reference
    reference = read_target("corral.envs.echo:EchoEnv")
    assert reference.manifest is None and reference.root == Path.cwd().resolve()


def test_errors_name_the_problem(tmp_path: Path, echo_env: Path) -> None:
    result = runner.invoke(app, ["serve", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "is not a directory, a file or an entry point" in result.output
    (tmp_path / "corral.yaml").write_text(
        "name: echo\nentry_point: corral.envs.echo:EchoEnv\nprot: 1\n"
    )
    result = runner.invoke(app, ["serve", str(tmp_path)])
    assert result.exit_code == 2 and "did you mean 'port'" in result.output
    result = runner.invoke(app, ["serve", "corral.envs.echo:NoSuchEnv"])
    assert result.exit_code == 2 and "has no attribute 'NoSuchEnv'" in result.output
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        result = runner.invoke(app, ["serve", str(echo_env), "--fd", str(udp.fileno())])
    assert result.exit_code == 2 and "not a TCP socket" in result.output
    with socket.socket() as unbound:
        result = runner.invoke(app, ["serve", str(echo_env), "--fd", str(unbound.fileno())])
    assert result.exit_code == 2 and "not listening" in result.output
