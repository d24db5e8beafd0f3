"""The ``corral`` command: one typer app; each command lives in its own module.

Commands are registered by reference (``"module:attribute"``) and imported only when they
run: ``corral serve`` loads the server and nothing of ``build``, ``validate``, ``push``,
``deploy``, ``k8s``, ``eval`` or ``replay`` (Docker's SDK, the validator, the Hub client, the
Kubernetes renderer, the evaluation loop), and ``corral --version`` loads nothing. The
command list in ``corral --help`` comes from the table below, without importing anything.
To add a command, add one :func:`register` line.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

import typer
from typer._click.exceptions import UsageError  # typer vendors click: its own UsageError
from typer.core import TyperCommand, TyperGroup


@dataclass(frozen=True)
class LazyCommand:
    """A command known by name and reference, imported when it runs.

    Attributes:
        name: what the user types (``corral NAME``).
        reference: ``module:attribute`` (the attribute may be dotted): a typer command
            function or a ``typer.Typer`` app (a group of subcommands, such as ``schema``).
        help: the one line ``corral --help`` shows.
    """

    name: str
    reference: str
    help: str

    def load(self) -> Any:
        """The click command: the reference imported and turned into one."""
        module, _, attributes = self.reference.partition(":")
        target: Any = importlib.import_module(module)
        for attribute in attributes.split("."):
            target = getattr(target, attribute)
        command: Any
        if isinstance(target, typer.Typer):
            command = typer.main.get_group(target)
        else:
            single = typer.Typer(add_completion=False)
            single.command(self.name)(target)
            command = typer.main.get_command(single)
        command.name = self.name
        return command


COMMANDS: dict[str, LazyCommand] = {}
"""The registered commands, in ``corral --help`` order."""


def register(name: str, reference: str, help: str) -> None:
    """Add ``corral NAME``, implemented by ``reference`` (``module:attribute``)."""
    COMMANDS[name] = LazyCommand(name, reference, help)


register(
    "init",
    "corral.cli.init:init_command",
    "Scaffold a complete environment package: models, environment, tests, manifest, "
    "pyproject.toml, schema lock, Dockerfile and README.",
)
register(
    "serve",
    "corral.cli.serve:serve_command",
    "Serve an environment over WebSocket and HTTP (loopback by default).",
)
register(
    "validate",
    "corral.cli.validate.command:validate_command",
    "Check an environment: statically and through a real server, or a running server by URL.",
)
register(
    "build",
    "corral.cli.build:build_command",
    "Generate the Dockerfile from the manifest and build the image, with progress.",
)
register(
    "push",
    "corral.cli.push:push_command",
    "Stage a Docker Space (README front matter, Dockerfile, pinned wheels) and upload it.",
)
register(
    "replay",
    "corral.cli.replay:replay_command",
    "Re-run recorded episodes from their seeds, tasks and actions; report the first "
    "diverging observation of each.",
)
register(
    "eval",
    "corral.cli.eval:eval_command",
    "Evaluate a policy on an environment: N episodes, recorded, summarized.",
)
register(
    "mcp",
    "corral.cli.mcp:mcp_command",
    "Serve an environment to an MCP client over stdin/stdout: reset, its action, its tools.",
)
register(
    "schema",
    "corral.cli.schema:schema_app",
    "Lock the contract's schemas and check changes against the lock (for CI).",
)
register(
    "deploy",
    "corral.cli.deploy:deploy_app",
    "Render deployment manifests for a long-lived fleet of servers.",
)
register(
    "k8s",
    "corral.cli.deploy:k8s_app",
    "Kubernetes housekeeping: sweep what dead providers left.",
)


class LazyGroup(TyperGroup):
    """A typer group that imports a registered command only when it is looked up to run."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        """Commands added the usual way, then the registered ones."""
        eager = super().list_commands(ctx)
        return eager + [name for name in COMMANDS if name not in eager]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``, imported on first use (a stand-in while listing)."""
        found = super().get_command(ctx, cmd_name)
        lazy = COMMANDS.get(cmd_name)
        if found is not None or lazy is None:
            return found
        if self._listing:
            return TyperCommand(lazy.name, help=lazy.help, short_help=lazy.help)
        command = lazy.load()
        self.commands[cmd_name] = command
        return command

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """Typer's lookup, with "did you mean" suggestions among the registered commands."""
        try:
            return super().resolve_command(ctx, args)
        except UsageError as exc:
            if args and "Did you mean" not in exc.message:
                matches = get_close_matches(args[0], self.list_commands(ctx))
                if matches:
                    suggestions = ", ".join(repr(m) for m in matches)
                    exc.message = f"{exc.message.rstrip('.')}. Did you mean {suggestions}?"
            raise

    @contextmanager
    def _list_without_importing(self) -> Iterator[None]:
        self._listing = True
        try:
            yield
        finally:
            self._listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """``corral --help``: the command list comes from the table, nothing is imported."""
        with self._list_without_importing():
            super().format_help(ctx, formatter)


def _print_version(value: bool) -> None:
    # Eager: it runs while the options are parsed, before a missing command is an error.
    if value:
        from corral import __version__

        typer.echo(f"corral {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="corral",
    help="Isolated, typed, remote environments for agentic RL.",
    cls=LazyGroup,
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        help="Print corral's version and exit.",
        is_eager=True,
        callback=_print_version,
    ),
) -> None:
    """Isolated, typed, remote environments for agentic RL."""


def main() -> None:
    """Entry point of the ``corral`` console script."""
    app()


if __name__ == "__main__":
    main()
