"""The one class an environment author writes.

    class Echo(Environment[EchoAction, EchoObservation, State]):
        def reset(self, seed=None, **options): ...
        def step(self, action): ...
        def state(self): ...

The generic parameters declare the contract; ``reset``, ``step`` and ``state`` may be
plain methods (run off the server's event loop) or ``async def`` (awaited on it). An
environment may also declare a typed snapshot of its state, ``snapshot`` and ``restore``
(see :mod:`corral.contract.snapshot`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar, get_args, get_origin

from pydantic import BaseModel

from corral.contract.models import Action, Observation, State
from corral.contract.options import reset_options_model
from corral.contract.schema import Contract, parse_semver
from corral.contract.snapshot import Snapshot, snapshot_model
from corral.contract.tasks import Task
from corral.contract.wiresafe import make_wire_safe

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)

ActionMigration = Callable[[dict[str, Any]], dict[str, Any]]


class Environment(Generic[ActT, ObsT, StateT]):
    """Base class of every corral environment. One instance serves one session.

    Class attributes (all optional but the models, which the generic parameters give):
        action_type / observation_type / state_type: the contract models.
        name: the environment's name (default: the class name).
        description: one paragraph shown in ``/metadata`` and the web UI.
        contract_version: semantic version of the contract (default ``"1.0.0"``).
        auto_reset: a ``step`` after the episode ended resets the env and returns the
            first observation of the new episode, instead of ``EPISODE_ENDED``.
        thread_affinity: run every call of a session on one dedicated thread (for envs
            wrapping libraries that must stay on the thread that created them).
        blocking: always run this sync environment's calls off the event loop, under the
            step timeout. By default a sync env whose calls measure fast (a moving
            average under ``ServerConfig.inline_step_s``, ~100 µs) runs inline on the
            loop, saving a thread hop per call; set this for envs that may block
            unpredictably (network, subprocesses, locks), since an inline call cannot
            be timed out.
        action_migrations: ``{old_major: fn}`` turning an action dict of an older contract
            major version into one of the current version; clients of those majors are
            then accepted at the handshake.
        task_type: the :class:`~corral.contract.tasks.Task` model :meth:`task` returns.
        reset_options_type: the reset options' model, published in ``/schema`` and
            checked by the server (default: inferred from the ``reset`` signature; see
            :mod:`corral.contract.options`).
        snapshot_type: the :class:`~corral.contract.snapshot.Snapshot` model
            :meth:`snapshot` returns and :meth:`restore` takes (default: inferred from
            ``snapshot()``'s return annotation; None: the environment has no snapshots).

    The optional *tasks face* (:meth:`splits`, :meth:`num_tasks`, :meth:`task`) publishes
    a dataset of tasks; an environment that has one accepts ``reset(split=..., index=...)``
    (see :mod:`corral.contract.tasks`).
    """

    action_type: ClassVar[type[Action]]
    observation_type: ClassVar[type[Observation]]
    state_type: ClassVar[type[State]] = State
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    contract_version: ClassVar[str] = "1.0.0"
    auto_reset: ClassVar[bool] = False
    thread_affinity: ClassVar[bool] = False
    blocking: ClassVar[bool] = False
    action_migrations: ClassVar[dict[int, ActionMigration]] = {}
    task_type: ClassVar[type[Task]] = Task
    reset_options_type: ClassVar[type[BaseModel] | None] = None
    snapshot_type: ClassVar[type[Snapshot] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        args = _environment_args(cls)
        if args is not None:
            _adopt_generic_args(cls, args)
        if "name" not in cls.__dict__ or not cls.name:
            cls.name = cls.__name__
        parse_semver(cls.contract_version)
        for attr in ("action_type", "observation_type", "state_type", "task_type"):
            model = cls.__dict__.get(attr)
            if isinstance(model, type):
                make_wire_safe(model)
        if not (isinstance(cls.task_type, type) and issubclass(cls.task_type, Task)):
            raise TypeError(
                f"{cls.__name__}.task_type must be a subclass of corral.contract.tasks.Task, "
                f"got {cls.task_type!r}"
            )
        cls.snapshot_type = snapshot_model(cls, Environment.snapshot, Environment.restore)

    def reset(self, seed: int | None = None, **options: Any) -> ObsT:
        """Start a new episode and return its first observation."""
        raise NotImplementedError

    def step(self, action: ActT) -> ObsT:
        """Apply ``action`` and return the resulting observation."""
        raise NotImplementedError

    def state(self) -> StateT:
        """Return the environment's current state."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the environment's resources; called once when its session ends."""

    @classmethod
    def preflight(cls) -> dict[str, str]:
        """Check, before a server admits anyone, that this machine can run the environment
        as promised; return facts the server reports (``/health``, ``/metrics``), e.g.
        the coding environment's ``{"sandbox": "bwrap"}``.

        Raise (any exception, with a message saying what to change) to make the server
        refuse to start rather than run weaker than its operator expects. The default
        checks nothing.
        """
        return {}

    # The optional snapshot face (see corral.contract.snapshot): override both or neither.

    def snapshot(self) -> Snapshot:
        """The environment's whole state as its :attr:`snapshot_type` model.

        May be called in any phase of a session, before the first ``reset`` included.
        """
        raise NotImplementedError(f"{type(self).__name__} declares no snapshots")

    def restore(self, snapshot: Any) -> ObsT:
        """Rebuild the state ``snapshot`` captured, on a fresh instance, and return the
        observation of that state (as if the last ``reset``/``step`` had returned it)."""
        raise NotImplementedError(f"{type(self).__name__} declares no snapshots")

    @classmethod
    def has_snapshots(cls) -> bool:
        """True when the environment declares a snapshot model."""
        return cls.snapshot_type is not None

    # Optional web-UI hooks (OpenEnv's ``render_web`` / ``web_actions`` map onto them).
    # The server calls them on a short-lived instance of its own, not on a session's: they
    # must depend only on the observation they are given.

    def render_html(self, observation: ObsT) -> str | None:
        """HTML the web UI shows for ``observation``, or None for no custom view.

        It is shown in a sandboxed frame: scripts do not run and it cannot reach the page.
        """
        return None

    def web_actions(self, observation: ObsT) -> list[tuple[str, ActT]]:
        """One-click actions the web UI offers after ``observation``: ``(label, action)``."""
        return []

    # -- the optional tasks face: metadata only, side-effect free, may run on a
    # -- fresh instance that never sees a reset (the server's task routes do).

    def splits(self) -> list[str]:
        """The names of the task splits, e.g. ``["train", "test"]``.

        Raises:
            NotImplementedError: the environment publishes no tasks (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} publishes no tasks")

    def num_tasks(self, split: str) -> int:
        """How many tasks ``split`` holds (``split`` is one of :meth:`splits`)."""
        raise NotImplementedError(f"{type(self).__name__} publishes no tasks")

    def task(self, split: str, index: int) -> Task:
        """Task ``index`` (``0 <= index < num_tasks(split)``) of ``split``, a
        :attr:`task_type` instance."""
        raise NotImplementedError(f"{type(self).__name__} publishes no tasks")

    @classmethod
    def scripted_policy(cls, seed: int | None) -> Callable[[Any], Any] | None:
        """A baseline player shipped with the environment (``corral eval --policy
        scripted``): observation in, action out; None when there is none (the default).
        """
        return None

    @classmethod
    def has_tasks(cls) -> bool:
        """True when the environment implements the tasks face."""
        return cls.splits is not Environment.splits

    @classmethod
    def contract(cls) -> Contract:
        """The contract this environment publishes.

        Raises:
            TypeError: if the action or observation model was never declared.
        """
        for attr in ("action_type", "observation_type"):
            if not isinstance(getattr(cls, attr, None), type):
                raise TypeError(
                    f"{cls.__name__} declares no {attr}: subclass "
                    f"Environment[MyAction, MyObservation, MyState] or set {attr} = ..."
                )
        return Contract(
            name=cls.name or cls.__name__,
            version=cls.contract_version,
            action=cls.action_type,
            observation=cls.observation_type,
            state=cls.state_type,
            reset_options=reset_options_model(
                cls.reset, cls.reset_options_type, cls.name or cls.__name__
            ),
            snapshot=cls.snapshot_type,
        )


def _environment_args(cls: type) -> tuple[Any, ...] | None:
    """The ``(action, observation, state)`` arguments ``cls`` gives ``Environment``.

    Resolved through generic intermediates: with ``class Base(Environment[ActT, Obs, StT])``
    and ``class Env(Base[Act, St])``, ``Env`` gives ``(Act, Obs, St)``. Arguments that are
    still type variables stay type variables.
    """
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin = get_origin(base)
        if origin is Environment:
            return get_args(base)
        if isinstance(origin, type) and issubclass(origin, Environment):
            inherited = _environment_args(origin)
            if inherited is None:
                continue
            bound = dict(zip(getattr(origin, "__parameters__", ()), get_args(base), strict=False))
            return tuple(bound.get(a, a) if isinstance(a, TypeVar) else a for a in inherited)
    return None


def _adopt_generic_args(cls: type[Environment[Any, Any, Any]], args: tuple[Any, ...]) -> None:
    for attr, arg in zip(("action_type", "observation_type", "state_type"), args, strict=False):
        if isinstance(arg, type) and attr not in cls.__dict__:
            setattr(cls, attr, arg)
