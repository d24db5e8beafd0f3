"""The ``corral`` command's top level: its command table, lazy imports, ``--version``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import corral
from corral.cli.main import COMMANDS, LazyGroup, app

runner = CliRunner(env={"COLUMNS": "200"})

# Modules only some commands need: none of them may load for another command.
HEAVY = (
    "corral.cli.build",
    "corral.cli.push",
    "corral.cli.init",
    "corral.cli.schema",
    "corral.cli.validate",
    "corral.cli.validate.local",
    "corral.cli.validate.remote",
    "corral.cli.replay",
    "corral.cli.eval",
    "corral.cli.mcp",
    "corral.cli.deploy",
    "corral.providers.docker",
    "corral.providers.hfspace",
    "corral.providers.kubernetes",
    "corral.providers.ray",
    "corral.evaluation",
    "corral.replay",
    "corral.adapters.mcp",
    "docker",
    "huggingface_hub",
    "kubernetes",
    "kubernetes_asyncio",
    "ray",
    "mcp",
    "corral.client",
)


def imported_by(*argv: str) -> tuple[int, str, set[str]]:
    """Run ``corral ARGV`` in a fresh interpreter; its exit code, output and loaded modules."""
    script = (
        "import json, sys\n"
        "from corral.cli.main import main\n"
        f"sys.argv = ['corral', *{list(argv)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    code = exc.code or 0\n"
        "else:\n"
        "    code = 0\n"
        "print('\\nMODULES=' + json.dumps(sorted(sys.modules)))\n"
        "sys.exit(code)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": ""},
    )
    out, _, modules = run.stdout.rpartition("\nMODULES=")
    return run.returncode, out + run.stderr, set(json.loads(modules))


def test_the_command_table_is_pinned() -> None:
    assert list(COMMANDS) == [
        "init",
        "serve",
        "validate",
        "build",
        "push",
        "replay",
        "eval",
        "mcp",
        "schema",
        "deploy",
        "k8s",
    ]


def test_version_prints_the_version_and_loads_no_command() -> None:
    code, out, modules = imported_by("--version")
    assert code == 0, out
    assert out.strip() == f"corral {corral.__version__}"
    assert not {m for m in modules if m.startswith("corral.cli.") and m != "corral.cli.main"}


def test_help_lists_every_command_without_importing_them() -> None:
    code, out, modules = imported_by("--help")
    assert code == 0, out
    for name, command in COMMANDS.items():
        assert name in out and command.help.split()[0] in out
    assert not modules & set(HEAVY)


def test_serve_loads_the_server_and_nothing_of_the_other_commands() -> None:
    code, out, modules = imported_by("serve", "--help")
    assert code == 0, out
    assert "--max-sessions" in out
    assert "corral.cli.serve" in modules and "corral.server.app" in modules
    assert not modules & set(HEAVY)


def test_every_registered_command_loads_under_its_name() -> None:
    group = LazyGroup(name="corral")
    for name in COMMANDS:
        command = group.get_command(None, name)
        assert command is not None and command.name == name
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, result.output
        assert "Usage: corral " + name in " ".join(result.output.split())


def test_a_typo_suggests_the_command() -> None:
    result = runner.invoke(app, ["servx"])
    assert result.exit_code == 2
    assert "Did you mean 'serve'?" in result.output


def test_no_arguments_shows_the_help() -> None:
    result = runner.invoke(app, [])
    assert "serve" in result.output and "Missing command" not in result.output


def test_a_group_loads_only_its_own_module() -> None:
    code, out, modules = imported_by("deploy", "k8s", "--help")
    assert code == 0, out
    assert "--image" in out
    assert "corral.cli.deploy" in modules
    assert not modules & (set(HEAVY) - {"corral.cli.deploy"})


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["build", "{missing}"], "no such file or directory"),
        (["push", "{missing}", "--repo-id", "owner/name"], "no such file or directory"),
        (["init", "class"], "Python keyword"),
    ],
    ids=["build", "push", "init"],
)
def test_a_command_says_its_error_on_stderr_and_exits_2(
    tmp_path: Path, args: list[str], said: str
) -> None:
    # What a command made goes to stdout (it may be piped); what went wrong to stderr.
    missing = str(tmp_path / "nowhere")
    result = runner.invoke(app, [a.replace("{missing}", missing) for a in args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and said in result.stderr, result.stderr
    assert result.stdout == ""
