"""Validating an environment's reset options with a pydantic model, with a clear error."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from corral.errors import InvalidArgument

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
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'options'}: {err['msg']} "
            f"(got {err.get('input')!r})"
            for err in exc.errors()
        )
        raise InvalidArgument(
            f"invalid {env} options: {problems}. Accepted options: {accepted}",
            details={"accepted": sorted(model.model_fields)},
        ) from None
