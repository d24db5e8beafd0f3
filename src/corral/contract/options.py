"""Reset options: which ones an environment takes, and validating them with a clear error."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from corral.errors import InvalidArgument, validation_errors

M = TypeVar("M", bound=BaseModel)


def parse_reset_options(model: type[M], values: dict[str, Any], *, env: str, accepted: str) -> M:
    """Validate reset ``values`` with ``model``.

    Raises:
        InvalidArgument: naming every bad option, its value and the accepted options
            (``accepted`` is the human-readable list); the client sees ``INVALID_ARGUMENT``.
    """
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        errors = validation_errors(exc)
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'options'}: {err['msg']} "
            f"(got {err.get('input')!r})"
            for err in errors
        )
        raise InvalidArgument(
            f"invalid {env} options: {problems}. Accepted options: {accepted}",
            details={"accepted": sorted(model.model_fields), "errors": errors},
        ) from None


def accepted_reset_options(reset: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword options ``reset`` takes besides ``seed``; None if it takes ``**kwargs``.

    The one introspection of reset signatures: the server checks options against it
    (``INVALID_ARGUMENT`` for an unknown one), and the OpenEnv translation and adapter
    use it to tell an option from a key to drop.
    """
    params = inspect.signature(reset).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(
        name
        for name, p in params.items()
        if name not in ("self", "seed")
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


def check_reset_options(options: dict[str, Any], accepted: frozenset[str] | None, env: str) -> None:
    """Refuse reset ``options`` that ``env``'s reset does not take (``accepted``, as
    :func:`accepted_reset_options` gives it; None takes any).

    Raises:
        InvalidArgument: naming the unknown options and the accepted ones.
    """
    if accepted is None:
        return
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise InvalidArgument(
            f"unknown reset option(s) {unknown}; {env}.reset accepts "
            f"{sorted(accepted) or 'no options'}",
            details={"unknown": unknown, "accepted": sorted(accepted)},
        )
