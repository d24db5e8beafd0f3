"""Loading an environment from a ``module:attribute`` reference.

This is corral's one loader of entry points: ``corral serve``, the manifest's
``entry_point`` (``corral schema``, ``corral build``, ``corral validate``) and the
providers all resolve references through :func:`load_target`, and an environment
directory's through :func:`load_from_directory`. Which of them a command's TARGET needs
is decided by one rule, :mod:`corral.cli.target`.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

from corral.errors import UsageError

_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class TargetError(UsageError, ImportError, ValueError):
    """A reference is malformed, or its module or attribute cannot be found.

    It is both an ``ImportError`` and a ``ValueError`` so that callers catching either
    (an import problem, a bad argument) see it.
    """


def load_target(reference: str, *, search_path: str | Path | None = None) -> Any:
    """Import ``module:attribute`` (the attribute may be dotted) and return the object.

    Args:
        reference: e.g. ``"corral.envs.echo:EchoEnv"`` or ``"my_env.server:make_env"``.
        search_path: a directory put first on ``sys.path`` (an environment's folder), and
            left there: modules the environment imports later are found too.

    Raises:
        TargetError: the reference is not ``module:attribute``, the module cannot be
            imported or has no such attribute; the message says which and how to fix it.
    """
    if not _REFERENCE.match(reference):
        raise TargetError(
            f"entry point {reference!r} must look like 'package.module:Name' "
            "(a module path, a colon, then a class or factory name)"
        )
    module_name, _, attr_path = reference.partition(":")
    if search_path is not None:
        path = str(Path(search_path).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = f"module {exc.name!r}" if exc.name and exc.name != module_name else "it"
        raise TargetError(
            f"entry point {reference!r}: cannot import module {module_name!r} ({missing} is "
            "not found); check the spelling, run from the environment's directory, or "
            "install the environment's package"
        ) from exc
    except ImportError as exc:
        raise TargetError(
            f"entry point {reference!r}: importing module {module_name!r} failed: {exc}"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(
                f"entry point {reference!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    return obj


def load_from_directory(reference: str, root: str | Path) -> Any:
    """Import ``module:attribute`` of the environment directory ``root``.

    A directory that is a package itself (an ``__init__.py``, a name Python can import)
    is imported as one, as OpenEnv's server runs its environments: ``<dirname>.<module>``
    with the parent directory on the path, so that ``from ..models import X`` in the
    environment's app works; the directory goes on the path too, for the environments
    that import ``from models import X``. Any other directory's modules are imported from
    it as top-level modules.

    Raises:
        TargetError: neither import works; the message gives both failures.
    """
    where = Path(root).resolve()
    package = where.name
    if not ((where / "__init__.py").is_file() and package.isidentifier()):
        return load_target(reference, search_path=where)
    for path in (str(where), str(where.parent)):
        if path not in sys.path:
            sys.path.insert(0, path)
    qualified = f"{package}.{reference}"
    try:
        return load_target(qualified)
    except TargetError as as_package:
        try:
            return load_target(reference, search_path=where)
        except TargetError as plain:
            raise TargetError(
                f"cannot load {reference!r} from {where}: as the package {package!r} "
                f"({qualified!r}): {as_package}; from the directory: {plain}"
            ) from None
