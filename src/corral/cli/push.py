"""``corral push``: publish the environment as a Hugging Face Docker Space."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from corral.cli import console as cli_console
from corral.progress import Activity
from corral.providers.dockerfile import BuildError
from corral.providers.hfspace import HubUnreachable, SpaceError, push_space, stage_space
from corral.providers.manifest import ManifestError


def push_command(
    repo_id: Annotated[str, typer.Option("--repo-id", help="The Space: OWNER/NAME.")],
    path: Annotated[Path, typer.Argument(help="The environment's directory.")] = Path("."),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Stage the Space folder and show it; upload nothing.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="Where to stage the Space (default .corral/space).")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Hub token with write access (default: HF_TOKEN or the saved login)."),
    ] = None,
    private: Annotated[bool, typer.Option(help="Create the Space private.")] = False,
    endpoint: Annotated[
        str | None, typer.Option(help="Hub URL (default: HF_ENDPOINT or huggingface.co).")
    ] = None,
    offline: Annotated[
        bool,
        typer.Option("--offline/--online", help="Ship every wheel in the Space (offline)."),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Print every line of the staging's output.")
    ] = False,
) -> None:
    """Stage a Docker Space (README front matter, Dockerfile, pinned wheels) and upload it."""
    console = Console(highlight=False)
    manifest = cli_console.manifest(path)
    title = f"staging {manifest.name} for {repo_id}"
    with Activity(title, console=console, verbose=verbose) as activity:
        try:
            staged = stage_space(
                manifest.root,
                out or manifest.root / ".corral" / "space",
                repo_id,
                offline=offline,
                progress=activity,
            )
        except (ManifestError, SpaceError) as exc:
            activity.done(f"error: {exc}", style="red")
            raise typer.Exit(2) from None
        except BuildError as exc:
            activity.done(f"staging failed after {activity.seconds:.1f} s", style="red")
            console.print(escape(str(exc)), soft_wrap=True)
            raise typer.Exit(1) from None
        activity.done(
            f"staged {staged.directory} ({len(staged.files)} files) in {activity.seconds:.1f} s"
        )
    if dry_run or verbose:
        for name in staged.files:
            console.print(f"  {escape(name)}")
        console.print("front matter:")
        front = yaml.safe_dump(staged.front_matter, sort_keys=False, allow_unicode=True)
        console.print(escape(front))
    if dry_run:
        console.print("dry run: nothing uploaded.")
        return
    try:
        with console.status(f"uploading to {repo_id}"):
            pushed = push_space(
                staged.directory, repo_id, token, private=private or None, endpoint=endpoint
            )
    except ImportError as exc:
        raise cli_console.fail(str(exc)) from None
    except HubUnreachable as exc:
        raise cli_console.fail(str(exc), 1) from None
    except (OSError, ValueError) as exc:
        # huggingface_hub's HTTP errors derive from OSError; metadata errors from ValueError.
        console.print(f"[red]upload failed:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"[green]pushed[/green] {pushed.url} (commit {pushed.commit_oid[:12]})")
