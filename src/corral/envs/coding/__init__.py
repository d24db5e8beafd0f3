"""A sandboxed coding environment: the agent writes Python, hidden tests grade it.

Each episode has a task ("write ``is_prime(n)``", ...). Each action is Python source;
it runs in a sandboxed process, then the task's hidden cases call the function it
defined, in the same sandbox. The reward is the fraction of cases that pass; all of
them passing ends the episode. See :mod:`corral.envs.coding.env` for the rules and
options, :mod:`corral.envs.coding.tasks` for the tasks and how answers are compared.

    env = CodingEnv()                       # probes the machine, picks the strongest mode
    obs = env.reset(task="fizzbuzz")        # or reset(seed=3); persistent=True keeps state
    obs = env.step(CodeAction(code=source)) # obs.reward, obs.stdout, obs.killed_reason ...

The sandbox (:mod:`corral.sandbox`) gives every action's process resource limits, a wall
clock, capped output and a private working directory deleted with the episode; what each
mode guarantees is listed there. The expected answers never enter the sandbox: the
parent compares. ``CodingEnv(sandbox=...)`` chooses the mode (``"auto"``: the strongest
that works); the mode in use is in ``state().sandbox_mode`` and in each observation's
``metadata``. An episode (not ``persistent``) can be snapshotted with its working
directory's files and restored elsewhere (:class:`CodingSnapshot`).
"""

from corral.envs.coding.env import (
    CaseResult,
    CodeAction,
    CodeObservation,
    CodeState,
    CodingEnv,
    CodingSnapshot,
)
from corral.envs.coding.files import WorkspaceEntry
from corral.envs.coding.tasks import TASKS, CodingTask, Problem, TaskCase
from corral.sandbox import (
    KilledReason,
    SandboxError,
    SandboxLimits,
    SandboxMode,
    SandboxUnavailable,
    available_modes,
)

__all__ = [
    "TASKS",
    "CaseResult",
    "CodeAction",
    "CodeObservation",
    "CodeState",
    "CodingEnv",
    "CodingSnapshot",
    "CodingTask",
    "KilledReason",
    "Problem",
    "SandboxError",
    "SandboxLimits",
    "SandboxMode",
    "SandboxUnavailable",
    "TaskCase",
    "WorkspaceEntry",
    "available_modes",
]
