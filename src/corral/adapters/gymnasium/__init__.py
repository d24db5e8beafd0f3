"""Gymnasium adapters (``pip install 'corral[gymnasium]'``).

* :class:`GymEnvironment` serves any Gymnasium environment: ``GymEnvironment.for_id(
  "CartPole-v1")`` is an Environment subclass, and ``corral serve gym:CartPole-v1`` serves it.
* :class:`RemoteEnv` / :func:`as_gymnasium`: a remote session as a ``gymnasium.Env``.
* :class:`RemoteVectorEnv`: N remote sessions as a ``gymnasium.vector.VectorEnv``.
* :mod:`.spaces`: the mapping between Gymnasium spaces and contract types.
"""

try:
    import gymnasium as _gymnasium  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "corral.adapters.gymnasium needs Gymnasium: pip install 'corral[gymnasium]'"
    ) from exc

from corral.adapters.gymnasium.remote import ContractSpaces, RemoteEnv, as_gymnasium
from corral.adapters.gymnasium.serving import GymEnvironment, GymObservation, GymState, serve_target
from corral.adapters.gymnasium.spaces import SpaceConversionError, field_for_space, model_binding
from corral.adapters.gymnasium.vector import (
    ClientSessions,
    PoolSessions,
    RemoteVectorEnv,
    Sessions,
)

__all__ = [
    "ClientSessions",
    "ContractSpaces",
    "GymEnvironment",
    "GymObservation",
    "GymState",
    "PoolSessions",
    "RemoteEnv",
    "RemoteVectorEnv",
    "Sessions",
    "SpaceConversionError",
    "as_gymnasium",
    "field_for_space",
    "model_binding",
    "serve_target",
]
