"""Reset options: which ones an environment takes, their typed model, and validating them
with a clear error.

The reset-options model is part of the contract (published in ``/schema`` under
``reset_options``, fingerprinted, locked and diffed like the others): the one the
environment declares (``reset_options_type``), or else one inferred from the keyword
parameters of its ``reset`` signature. A ``reset(seed, **options)`` without a declared
model takes anything and publishes none.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

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


def reset_options_model(
    reset: Callable[..., Any], declared: type[BaseModel] | None, env: str
) -> type[BaseModel] | None:
    """The reset-options model of an environment whose ``reset`` is ``reset``.

    ``declared`` wins; otherwise the model has a field per keyword parameter of
    ``reset`` besides ``seed`` (its annotation, ``Any`` without one, and its default),
    forbidding others. None when ``reset`` takes ``**kwargs`` (anything goes) or no
    option at all (nothing to publish).
    """
    if declared is not None:
        return declared
    accepted = accepted_reset_options(reset)
    if not accepted:
        return None
    try:
        hints = typing.get_type_hints(reset)
    except Exception:  # an annotation that does not resolve: the option is Any
        hints = {}
    params = inspect.signature(reset).parameters
    fields: dict[str, Any] = {
        name: (
            hints.get(name, Any),
            ... if params[name].default is inspect.Parameter.empty else params[name].default,
        )
        for name in sorted(accepted)
    }
    model: type[BaseModel] = create_model(
        f"{env}ResetOptions", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model


def validate_reset_options(
    model: type[BaseModel] | None, options: dict[str, Any], env: str
) -> None:
    """Check ``options`` against the reset-options ``model`` (None: nothing to check).

    Raises:
        InvalidArgument: as :func:`parse_reset_options`.
    """
    if model is not None:
        parse_reset_options(model, options, env=env, accepted=", ".join(sorted(model.model_fields)))
