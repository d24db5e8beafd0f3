"""``corral build``: generate the environment's Dockerfile and build its image."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from corral.cli import console as cli_console
from corral.errors import CorralError
from corral.progress import Activity
from corral.providers.dockerfile import GENERATED_HEADER, BuildError


def refresh_dockerfile(env_dir: Path, generated: Path) -> bool:
    """Copy the build's Dockerfile over the environment's own, if that one was generated.

    ``corral init`` writes a ``Dockerfile`` so that the image is visible in the
    environment's directory; rebuilding keeps it in step with the manifest. A
    Dockerfile written by hand (without corral's header) is never touched.

    Returns:
        Whether the environment's Dockerfile was rewritten.
    """
    own = env_dir / "Dockerfile"
    if not own.is_file() or not own.read_text(encoding="utf-8").startswith(GENERATED_HEADER):
        return False
    text = generated.read_text(encoding="utf-8")
    if own.read_text(encoding="utf-8") == text:
        return False
    own.write_text(text, encoding="utf-8")
    return True


def build_command(
    path: Annotated[Path, typer.Argument(help="The environment's directory.")] = Path("."),
    base_image: Annotated[
        str | None,
        typer.Option(
            envvar="CORRAL_BASE_IMAGE",
            help="Image to build on (default: $CORRAL_BASE_IMAGE, else the manifest's).",
        ),
    ] = None,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline/--online",
            help="Offline: download every wheel on the host and install with --no-index "
            "(no network needed inside the build). Online: the image installs the pinned "
            "versions from the package index.",
        ),
    ] = True,
    tag: Annotated[
        str | None, typer.Option(help="Image tag (default: corral-NAME:VERSION).")
    ] = None,
    context: Annotated[
        Path | None, typer.Option(help="Where to write the build context (default .corral/build).")
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Print every line of the build's output.")
    ] = False,
) -> None:
    """Generate the Dockerfile from the manifest and build the image, with progress."""
    console = Console(highlight=False)
    manifest = cli_console.manifest(path)
    try:
        from corral.providers.docker import build_image
    except ImportError as exc:
        raise cli_console.fail(str(exc)) from None

    with Activity(f"building {manifest.name}", console=console, verbose=verbose) as activity:
        try:
            built = build_image(
                manifest.root,
                tag,
                base_image=base_image,
                offline=offline,
                progress=activity,
                context_dir=context,
            )
        except (BuildError, CorralError) as exc:
            activity.done(f"build failed after {activity.seconds:.1f} s", style="red")
            console.print(escape(str(exc)), soft_wrap=True)
            raise typer.Exit(1) from None
        mode = "offline" if offline else "online"
        wheels = len(built.context.requirements)
        activity.done(
            f"built {built.tag} ({built.image_id[:19]}) in {built.seconds:.1f} s, {mode}, "
            f"{wheels} pinned distributions, from {built.context.base_image}; context in "
            f"{built.context.directory} (-v shows the build's output)"
        )
    if refresh_dockerfile(manifest.root, built.context.dockerfile):
        console.print(f"updated {manifest.root / 'Dockerfile'} (generated from the manifest)")
