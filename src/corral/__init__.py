"""corral: isolated, typed, remote environments for agentic reinforcement learning.

    import corral

    class Guess(corral.Action): ...
    class Hint(corral.Observation): ...
    class GuessEnv(corral.Environment[Guess, Hint, corral.State]): ...

    async with corral.AsyncEnvClient("http://127.0.0.1:8000", env=GuessEnv) as env:
        result = await env.reset(seed=1)

The nouns a user learns are here; everything else lives in its subpackage
(:mod:`corral.client`, :mod:`corral.contract`, :mod:`corral.server`,
:mod:`corral.providers`, :mod:`corral.adapters`, :mod:`corral.testing`). They are
imported on first use, so ``import corral`` costs next to nothing and ``EnvPool`` needs
numpy only when it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.client import AsyncEnvClient, EnvPool, SyncEnvClient
    from corral.contract import Action, Environment, Observation, State, StepResult
    from corral.errors import CorralError

    __version__: str

_HOMES = {
    "Action": "corral.contract",
    "AsyncEnvClient": "corral.client",
    "CorralError": "corral.errors",
    "EnvPool": "corral.client.pool",
    "Environment": "corral.contract",
    "Observation": "corral.contract",
    "State": "corral.contract",
    "StepResult": "corral.contract",
    "SyncEnvClient": "corral.client",
}
"""Where each top-level name lives."""


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("corral")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0"


__all__ = [
    "Action",
    "AsyncEnvClient",
    "CorralError",
    "EnvPool",
    "Environment",
    "Observation",
    "State",
    "StepResult",
    "SyncEnvClient",
    "__version__",
]
