"""The ``corral`` command: one typer app; each command lives in its own module."""

from __future__ import annotations

import typer

from corral.cli.build import build_command
from corral.cli.eval import eval_command
from corral.cli.init import init_command
from corral.cli.push import push_command
from corral.cli.replay import replay_command
from corral.cli.schema import schema_app
from corral.cli.serve import serve_command
from corral.cli.validate import validate_command

app = typer.Typer(
    name="corral",
    help="Isolated, typed, remote environments for agentic RL.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", help="Print corral's version and exit."),
) -> None:
    """Isolated, typed, remote environments for agentic RL."""
    if version:
        from corral import __version__

        typer.echo(__version__)
        raise typer.Exit()


app.command("init")(init_command)
app.command("serve")(serve_command)
app.command("validate")(validate_command)
app.command("build")(build_command)
app.command("push")(push_command)
app.command("replay")(replay_command)
app.command("eval")(eval_command)
app.add_typer(schema_app)


def main() -> None:
    """Entry point of the ``corral`` console script."""
    app()


if __name__ == "__main__":
    main()
