"""A sandboxed coding environment: the agent writes Python, hidden tests grade it.

See :mod:`corral.envs.coding.env` for the episode rules and
:mod:`corral.envs.coding.sandbox` for the machinery. (Sandbox guarantees: TODO.)
"""

from corral.envs.coding.env import (
    CaseResult,
    CodeAction,
    CodeObservation,
    CodeState,
    CodingEnv,
)
from corral.envs.coding.sandbox import (
    KilledReason,
    SandboxError,
    SandboxLimits,
    SandboxMode,
    SandboxUnavailable,
    available_modes,
)
from corral.envs.coding.tasks import TASKS, Task, TaskCase

__all__ = [
    "TASKS",
    "CaseResult",
    "CodeAction",
    "CodeObservation",
    "CodeState",
    "CodingEnv",
    "KilledReason",
    "SandboxError",
    "SandboxLimits",
    "SandboxMode",
    "SandboxUnavailable",
    "Task",
    "TaskCase",
    "available_modes",
]
