"""Route bodies whose model is known only when the app is built.

FastAPI reads a route's body model from the handler's annotations. A route defined once
for every environment kind (OpenEnv's HTTP routes, the Task API) takes the body model of
the kind served (corral's, or the installed OpenEnv release's own request models, so that
bodies are validated and reported exactly as under OpenEnv's server): :func:`with_body`
gives the handler that annotation at run time.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Body
from pydantic import BaseModel


def with_body(
    handler: Callable[..., Awaitable[Any]],
    name: str,
    model: type[BaseModel],
    *,
    optional: bool = False,
) -> Callable[..., Awaitable[Any]]:
    """``handler`` with its parameter ``name`` read from the body as a ``model``.

    Args:
        handler: the route's handler; its other parameters keep their annotations.
        name: the parameter that receives the body.
        model: the body's model.
        optional: an absent body is ``model()`` (every field defaulted).
    """
    signature = inspect.signature(handler)
    default = Body(default_factory=model) if optional else Body()
    body = inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=model
    )
    # Last: a parameter with a default (the body) may not precede one without.
    params = [p for p in signature.parameters.values() if p.name != name]
    handler.__signature__ = signature.replace(parameters=[*params, body])  # type: ignore[attr-defined]
    return handler


__all__ = ["with_body"]
