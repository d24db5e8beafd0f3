"""The ``corral`` command: one typer app; each command lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="corral",
    help="Isolated, typed, remote environments for agentic RL.",
    no_args_is_help=True,
    add_completion=False,
)


def main() -> None:
    """Entry point of the ``corral`` console script."""
    app()


if __name__ == "__main__":
    main()
