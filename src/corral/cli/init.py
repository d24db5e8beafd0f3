"""``corral init NAME``: scaffold a complete, working environment package.

    corral init demo_env
    cd demo_env && corral validate && corral build && corral validate

writes ``NAME/`` with the models and the environment (a number-guessing game to replace
with your own), its tests (unit tests, and an end-to-end serialization test through a
real server, both passing as generated), ``corral.yaml``, ``pyproject.toml``, the
schema lock, a ``Dockerfile`` rendered by :mod:`corral.providers.dockerfile` and a
README whose contract tables are generated from the models.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import keyword
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template
from typing import Annotated
from urllib.parse import unquote, urlparse

import typer
from rich.console import Console
from rich.markup import escape

import corral
from corral.cli import console as cli_console
from corral.contract.lock import write_lock
from corral.errors import UsageError
from corral.providers.dockerfile import image_labels, image_tag, render_dockerfile
from corral.providers.hfspace import contract_markdown
from corral.providers.manifest import load_contract, load_manifest

_NAME = re.compile(r"^[a-z][a-z0-9]*([_-][a-z0-9]+)*$")

# Generated file -> template, in writing order.
_FILES = {
    "corral.yaml": "corral.yaml.tmpl",
    "pyproject.toml": "pyproject.toml.tmpl",
    ".gitignore": "gitignore.tmpl",
    "{package}/__init__.py": "__init__.py.tmpl",
    "{package}/models.py": "models.py.tmpl",
    "{package}/env.py": "env.py.tmpl",
    "tests/test_env.py": "test_env.py.tmpl",
    "tests/test_serialization.py": "test_serialization.py.tmpl",
}


class InitError(UsageError, ValueError):
    """The scaffold cannot be written; the message says why and what to do."""


@dataclass(frozen=True)
class Names:
    """How NAME is spelled in each place.

    Attributes:
        name: the manifest's and the distribution's name (``demo_env``, ``demo-env``).
        package: the Python package (``demo_env``).
        cls: the prefix of the class names (``Demo`` → ``DemoEnv``, ``DemoAction``).
    """

    name: str
    package: str
    cls: str


def names_for(name: str) -> Names:
    """Check NAME and derive the package and class names from it.

    Raises:
        InitError: NAME is not a valid name, or its package would shadow an importable
            module (``json``, ``corral``...).
    """
    if not _NAME.match(name):
        suggestion = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "my_env"
        if suggestion[0].isdigit():
            suggestion = f"env_{suggestion}"
        raise InitError(
            f"{name!r} is not a valid environment name: use lowercase letters and digits, "
            f"separated by '_' or '-', starting with a letter (e.g. {suggestion!r})"
        )
    package = name.replace("-", "_")
    if keyword.iskeyword(package):
        raise InitError(f"{name!r} is a Python keyword; pick another name, e.g. '{name}_env'")
    if package in sys.stdlib_module_names or importlib.util.find_spec(package) is not None:
        raise InitError(
            f"a module named {package!r} is already importable here, and the new package "
            f"would be confused with it; pick another name, e.g. '{package}_env'"
        )
    stem = package.removesuffix("_env") or package
    cls = "".join(part.capitalize() for part in stem.split("_"))
    return Names(name=name, package=package, cls=cls)


def corral_source() -> str:
    """What ``pip install`` needs to get this corral into another virtualenv.

    corral is not on the package index yet, so a generated project's ``corral>=VERSION``
    cannot be resolved there. pip records where each distribution came from
    (``direct_url.json``): the source tree of an editable install, or the wheel or
    directory it was installed from; that local path is given to pip next to the
    project. A corral installed from an index is found there again: ``corral==VERSION``.
    """
    try:
        recorded = importlib.metadata.distribution("corral").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        recorded = None
    url = str(json.loads(recorded).get("url", "")) if recorded else ""
    if url.startswith("file://"):
        return unquote(urlparse(url).path)
    return f"corral=={corral.__version__}"


def install_command() -> str:
    """The command that installs a generated project with its tests in a fresh virtualenv."""
    return f"pip install {shlex.quote(corral_source())} -e '.[test]'"


def _template(name: str) -> Template:
    text = resources.files("corral.cli").joinpath("templates", "env", name).read_text("utf-8")
    return Template(text)


@contextlib.contextmanager
def _imported_from(root: Path, package: str) -> Iterator[None]:
    """Leave ``sys.path`` and ``sys.modules`` as they were once the scaffold was imported."""
    path = str(root.resolve())
    had_path = path in sys.path
    try:
        yield
    finally:
        if not had_path:
            with contextlib.suppress(ValueError):
                sys.path.remove(path)
        for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[module]
        importlib.invalidate_caches()


def scaffold(name: str, parent: str | Path = ".", *, force: bool = False) -> Path:
    """Write the environment package ``NAME`` in ``parent`` (see the module docstring).

    Args:
        name: the environment's name.
        parent: the directory to create ``NAME/`` in.
        force: write into an existing, non-empty directory (files are overwritten).

    Returns:
        The new environment's directory.

    Raises:
        InitError: a bad name, or the directory exists and is not empty (without force).
    """
    names = names_for(name)
    root = Path(parent) / name
    if root.exists() and (not root.is_dir() or any(root.iterdir())) and not force:
        raise InitError(f"{root} already exists and is not empty; pick another NAME or --force")
    values = {
        "name": names.name,
        "package": names.package,
        "cls": names.cls,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "corral_version": corral.__version__,
        "install": install_command(),
    }
    for target, template in _FILES.items():
        path = root / target.format(package=names.package)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_template(template).substitute(values), encoding="utf-8")
    manifest = load_manifest(root)
    with _imported_from(root, names.package):
        contract = load_contract(manifest)
    lock = write_lock(contract, manifest.lock_path)
    readme = _template("README.md.tmpl").substitute(
        values, fingerprint=lock.fingerprint, contract=contract_markdown(contract.schemas)
    )
    (root / "README.md").write_text(readme, encoding="utf-8")
    dockerfile = render_dockerfile(
        manifest, labels=image_labels(manifest, lock.fingerprint), base_image=manifest.image_base
    )
    (root / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    return root


def init_command(
    name: Annotated[str, typer.Argument(help="The environment's name, e.g. demo_env.")],
    directory: Annotated[
        Path, typer.Option("--dir", help="Where to create NAME/ (default: here).")
    ] = Path("."),
    force: Annotated[
        bool, typer.Option("--force", help="Write into an existing, non-empty NAME/.")
    ] = False,
) -> None:
    """Scaffold a complete environment package: models, environment, tests, manifest,
    pyproject.toml, schema lock, Dockerfile and README."""
    console = Console(highlight=False)
    try:
        root = scaffold(name, directory, force=force)
    except InitError as exc:
        raise cli_console.fail(str(exc)) from None
    manifest = load_manifest(root)
    console.print(f"[green]created[/green] {escape(str(root))}:")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        console.print(f"  {escape(str(path.relative_to(root)))}")
    console.print(
        "\nnext:\n"
        f"  cd {escape(str(root))}\n"
        "  corral validate        # static checks and a smoke test through a real server\n"
        "  corral serve .         # serve it on 127.0.0.1:8000\n"
        f"  corral build           # the Docker image {escape(image_tag(manifest))}\n"
        "  pytest                 # its own tests\n"
        "\nto install it (importable from any directory), also in a fresh virtualenv:\n"
        f"  {escape(install_command())}\n"
        "  (corral is not on PyPI yet: pip takes it from where this corral was installed)"
    )
