"""Loading an environment from a ``module:attribute`` reference."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any


def load_target(reference: str, *, search_path: str | Path | None = None) -> Any:
    """Import ``module:attribute`` (attribute may be dotted) and return the object.

    Args:
        reference: e.g. ``"corral.envs.echo:EchoEnv"`` or ``"my_env.server:make_env"``.
        search_path: a directory put first on ``sys.path`` (an environment's folder).

    Raises:
        ValueError: the reference is not ``module:attribute`` or cannot be resolved.
    """
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"environment reference {reference!r} must look like 'package.module:ClassName'"
        )
    if search_path is not None:
        path = str(Path(search_path).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for {reference!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attr!r}") from None
    return obj
