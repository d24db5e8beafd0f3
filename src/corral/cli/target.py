"""TARGET: what a command is pointed at, read by one rule for every command.

``corral serve``, ``corral mcp`` and ``corral eval`` take the same TARGET, tried in this
order:

=====================  ==========================================================
``http://…``/``ws://…``  a running server (``eval`` only; several, comma-separated)
``gym:ENV_ID``           a registered Gymnasium environment
a directory / file      an environment directory, or its ``corral.yaml`` /
                        ``openenv.yaml``: the manifest names the entry point
                        (``openenv.yaml`` without ``app:``: ``server.app:app``, as
                        OpenEnv's own default)
``module:attr``          an Environment class, a factory, or OpenEnv's app (its
                        ``create_app(...)`` result), imported with the current
                        directory first on the path, as ``python -m corral`` does
an identifier           an installed OpenEnv environment package
                        (``<pkg>.server.app:app``)
=====================  ==========================================================

A directory's modules are imported from it; when it is a package itself (OpenEnv's
environments are: their apps import ``from ..models``), as ``<dirname>.<module>`` with
its parent on the path, as OpenEnv's server runs it. A class or app written for OpenEnv
is adapted (:mod:`corral.adapters.openenv_env`). A target none of these fit, or one that
cannot be loaded, is a :class:`~corral.server.target.TargetError` whose message says
which forms work.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from corral.contract import Environment
from corral.providers.manifest import Manifest, ManifestError, load_manifest
from corral.server.target import TargetError, load_from_directory, load_target

FORMS = (
    "an environment directory (with corral.yaml or openenv.yaml), 'package.module:ClassName', "
    "'package.server.app:app', 'gym:CartPole-v1' or an installed OpenEnv environment package"
)
"""The forms every command's TARGET may take, for error messages."""

_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")


class TargetKind(StrEnum):
    """Which form a TARGET took."""

    URL = "url"
    GYM = "gym"
    DIRECTORY = "directory"
    REFERENCE = "reference"
    PACKAGE = "package"


@dataclass(frozen=True)
class Target:
    """A TARGET, read (not loaded yet).

    Attributes:
        text: as given.
        kind: its form.
        reference: the entry point (``module:attr``; a directory's from its manifest; an
            OpenEnv package's app), ``gym:ID``, or the URL text.
        root: the directory its modules are imported from (absolute).
        manifest: the environment's manifest, for a directory.
    """

    text: str
    kind: TargetKind
    reference: str
    root: Path
    manifest: Manifest | None = None

    @property
    def urls(self) -> list[str]:
        """The servers a URL target names."""
        return [u.strip() for u in self.reference.split(",") if u.strip()]

    @property
    def server_target(self) -> str:
        """What a ``corral serve`` child process is given to serve this target (from any
        working directory: a directory as its absolute path)."""
        if self.kind is TargetKind.DIRECTORY:
            assert self.manifest is not None and self.manifest.path is not None
            return str(self.manifest.path.resolve())
        return self.reference

    def load(self, *, make_kwargs: dict[str, Any] | None = None) -> Any:
        """What ``create_app`` takes: the environment class or factory (an OpenEnv one
        adapted), or the served Gymnasium environment.

        Args:
            make_kwargs: ``gymnasium.make`` keyword arguments (``gym:ID`` targets only).

        Raises:
            TargetError: a URL, keyword arguments for another form, or the entry point
                cannot be imported or adapted; the message says how to fix it.
        """
        if self.kind is TargetKind.URL:
            raise TargetError(f"{self.text!r} is a running server; this command needs {FORMS}")
        if make_kwargs and self.kind is not TargetKind.GYM:
            raise TargetError(
                "--kwarg passes gymnasium.make keyword arguments: only a 'gym:ENV_ID' target "
                "takes them"
            )
        if self.kind is TargetKind.GYM:
            from corral.adapters.gymnasium import serve_target

            try:
                return serve_target(self.reference, search_path=self.root, make_kwargs=make_kwargs)
            except (ValueError, ImportError) as exc:
                raise TargetError(str(exc)) from None
        if self.kind is TargetKind.DIRECTORY:
            obj = load_from_directory(self.reference, self.root)
        else:
            obj = load_target(self.reference, search_path=self.root)
        from corral.adapters.openenv_env import openenv_target

        try:
            return openenv_target(obj, forms=self._other_forms())
        except (TypeError, ImportError) as exc:
            raise TargetError(str(exc)) from None

    def env_class(self) -> type[Environment[Any, Any, Any]] | None:
        """The corral Environment class served (typed models for a client or a policy),
        or None for a URL, a factory or a Gymnasium environment.

        Raises:
            TargetError: as :meth:`load`.
        """
        if self.kind in (TargetKind.URL, TargetKind.GYM):
            return None
        obj = self.load()
        return obj if isinstance(obj, type) and issubclass(obj, Environment) else None

    def _other_forms(self) -> str:
        """The forms of this environment that name its app, for a class that needs it."""
        module = self.reference.partition(":")[0]
        package = module.split(".")[0]
        return f"'{package}.server.app:app' or the environment's directory"


def read_target(text: str, *, urls: bool = False, cwd: Path | None = None) -> Target:
    """Read TARGET by the rule of this module's docstring.

    Args:
        text: the TARGET as the user gave it.
        urls: a running server's URL is a valid target (``corral eval``).
        cwd: the directory references are imported from (default: the current one).

    Raises:
        TargetError: TARGET fits no form, or its manifest is invalid; the message says
            which forms work.
    """
    here = (cwd or Path.cwd()).resolve()
    if text.startswith(_URL_SCHEMES):
        if not urls:
            raise TargetError(f"{text!r} is a running server; this command needs {FORMS}")
        return Target(text, TargetKind.URL, text, here)
    if text.startswith("gym:"):
        return Target(text, TargetKind.GYM, text, here)
    path = Path(text)
    if path.is_dir() or (path.suffix in (".yaml", ".yml") and path.is_file()):
        try:
            manifest = load_manifest(path)
        except ManifestError as exc:
            raise TargetError(str(exc)) from None
        root = manifest.root.resolve()
        return Target(text, TargetKind.DIRECTORY, manifest.entry_point, root, manifest)
    if ":" in text:
        return Target(text, TargetKind.REFERENCE, text, here)
    if text.isidentifier() and _is_package_with_app(text, here):
        return Target(text, TargetKind.PACKAGE, f"{text}.server.app:app", here)
    raise TargetError(
        f"{text!r} is not a directory, a file or an entry point; pass {FORMS}"
        + (", or a server URL" if urls else "")
    )


def _is_package_with_app(name: str, where: Path) -> bool:
    """``name`` is an importable package with a ``server.app`` module (OpenEnv's layout)."""
    import sys

    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    try:
        return importlib.util.find_spec(f"{name}.server.app") is not None
    except (ImportError, ValueError):
        return False


__all__ = ["FORMS", "Target", "TargetKind", "read_target"]
