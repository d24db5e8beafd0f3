"""How every command speaks: what it made on stdout, what went wrong on stderr.

One place decides the consoles' settings and the shape of an error line, so that a command's
output can be piped (``corral schema export > schema.json``) while its errors still reach the
terminal, and every command fails the same way: ``error: <what>`` and exit status 2 for a
usage or input problem.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from corral.providers.manifest import Manifest, ManifestError, load_manifest


def output() -> Console:
    """The console for what a command made (stdout); long lines wrap softly, so they paste."""
    return Console(highlight=False, soft_wrap=True)


def errors() -> Console:
    """The console for errors, warnings and progress (stderr)."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Say ``error: message`` on stderr and give the exit to raise: ``raise fail(...)``."""
    errors().print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


def manifest(path: Path) -> Manifest:
    """The manifest at ``path`` (a directory or its ``corral.yaml``), or fail saying why not."""
    try:
        return load_manifest(path)
    except ManifestError as exc:
        raise fail(str(exc)) from None
