"""The task API over HTTP, with OpenEnv 0.10's and the Open Reward Standard's routes.

* ``GET /list_environments`` → ``["wordle"]``
* ``GET /{env}/splits`` → ``[{"name": "train", "type": "train"}, ...]``
* ``POST /{env}/tasks`` ``{"split"}`` → ``{"tasks": [...], "env_name": "wordle"}``
* ``POST /{env}/num_tasks`` ``{"split"}`` → ``{"num_tasks": 384}``
* ``POST /{env}/task`` ``{"split", "index"}`` → ``{"task": {...}}``
* ``POST /{env}/task_range`` ``{"split", "start"?, "stop"?}`` → ``{"tasks": [...]}``

``{env}`` is the environment's name (its class name is accepted too, as OpenEnv names
environments by class), compared without regard to case. Tasks are the environment's
:class:`~corral.contract.tasks.Task` models as JSON. Answers are read from one instance
of the environment made on first use (the tasks face is side-effect free) and closed
with the app.

Each route is defined once (:func:`tasks_router`) and answered by a :class:`TaskAnswers`:
this module's :class:`TaskCatalog` for a corral environment, the environment's own task
methods with OpenEnv 0.10's semantics for an OpenEnv one (chosen by the server's
personality, :mod:`corral.server.openenv`).

corral's errors are JSON ``{"detail", "code", "message", "details"}`` like its other HTTP
routes, ``code`` ``INVALID_ARGUMENT`` and ``details.reason`` saying which: ``404`` for an
unknown environment name or split, and when the environment publishes no tasks
(``no_tasks``; OpenEnv answers 501 there, a status corral keeps for its own failures),
``400`` for an index out of range or a listing too large, ``422`` for a malformed body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from corral.contract import Environment
from corral.contract.tasks import count_tasks, resolve_task, split_kind, task_range
from corral.errors import CorralError, FactoryError, InvalidArgument
from corral.server.bodies import with_body
from corral.server.http_errors import ErrorBody, error_response
from corral.server.service import EnvService

T = TypeVar("T")

_STATUS_BY_REASON = {
    "no_tasks": 404,
    "unknown_split": 404,
    "unknown_environment": 404,
}


class SplitBody(BaseModel):
    """A request naming a split."""

    model_config = ConfigDict(extra="forbid")

    split: str = Field(description="Task split name")


class TaskBody(SplitBody):
    """A request naming one task."""

    index: int = Field(description="Task index within the split")


class RangeBody(SplitBody):
    """A request naming a range of tasks (Python slice bounds)."""

    start: int | None = Field(default=None, description="Inclusive start index")
    stop: int | None = Field(default=None, description="Exclusive stop index")


class SplitInfo(BaseModel):
    """A split as OpenEnv and ORS describe it."""

    name: str
    type: str


class TaskList(BaseModel):
    """``/{env}/tasks``' answer."""

    tasks: list[dict[str, Any]]
    env_name: str


class TaskCount(BaseModel):
    """``/{env}/num_tasks``' answer."""

    num_tasks: int


class OneTask(BaseModel):
    """``/{env}/task``' answer."""

    task: dict[str, Any]


class TaskSlice(BaseModel):
    """``/{env}/task_range``' answer."""

    tasks: list[dict[str, Any]]


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "An index out of range, or too many tasks."},
    404: {"model": ErrorBody, "description": "No such environment or split, or no tasks."},
    500: {"model": ErrorBody, "description": "The environment could not be made."},
}


class TaskAnswers(Protocol):
    """What answers the Task API routes (each route is defined once, in
    :func:`tasks_router`): corral's :class:`TaskCatalog`, or an OpenEnv environment's own
    task methods (:class:`corral.server.openenv.peer.PeerTasks`)."""

    def body(self, route: str) -> type[BaseModel]:
        """The body model of ``POST /{env}/<route>`` (``tasks``, ``num_tasks``, ``task``,
        ``task_range``)."""
        ...

    def docs(self, route: str) -> dict[str, Any]:
        """Extra OpenAPI keywords of ``route`` (``splits`` or a body route)."""
        ...

    async def list_environments(self) -> Response:
        """``GET /list_environments``."""
        ...

    async def splits(self, env_name: str) -> Response:
        """``GET /{env}/splits``."""
        ...

    async def answer(self, route: str, env_name: str, body: Any) -> Response:
        """``POST /{env}/<route>`` with its validated body."""
        ...

    async def close(self) -> None:
        """Release what the answers hold."""
        ...


_BODIES: dict[str, type[BaseModel]] = {
    "tasks": SplitBody,
    "num_tasks": SplitBody,
    "task": TaskBody,
    "task_range": RangeBody,
}
_RESULTS: dict[str, type[BaseModel]] = {
    "splits": SplitInfo,
    "tasks": TaskList,
    "num_tasks": TaskCount,
    "task": OneTask,
    "task_range": TaskSlice,
}


class TaskCatalog:
    """corral's task answers: the environment instance the routes read, made on first use."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self._env: Environment[Any, Any, Any] | None = None
        self._lock = asyncio.Lock()

    def body(self, route: str) -> type[BaseModel]:
        """The body model of a ``POST`` task route."""
        return _BODIES[route]

    def docs(self, route: str) -> dict[str, Any]:
        """The answer model and error statuses of ``route``, for the OpenAPI document."""
        model: Any = list[SplitInfo] if route == "splits" else _RESULTS[route]
        return {"response_model": model, "responses": _ERRORS}

    def names(self) -> set[str]:
        """The names the routes answer to (lower case)."""
        return {self.service.contract.name.lower(), self.service.env_type.__name__.lower()}

    async def list_environments(self) -> Response:
        """The environments this server serves (one)."""
        return JSONResponse(self.listed())

    async def splits(self, env_name: str) -> Response:
        """The task splits, as ``{"name", "type"}``."""
        return await self._answer(
            env_name, lambda env: [{"name": s, "type": split_kind(s)} for s in env.splits()]
        )

    async def answer(self, route: str, env_name: str, body: Any) -> Response:
        """Every task of a split, their count, one task, or a range of them."""
        name = self.service.contract.name
        queries: dict[str, Callable[[Environment[Any, Any, Any]], Any]] = {
            "tasks": lambda env: {
                "tasks": [_dump(t) for t in task_range(env, body.split)],
                "env_name": name,
            },
            "num_tasks": lambda env: {"num_tasks": count_tasks(env, body.split)},
            "task": lambda env: {"task": _dump(resolve_task(env, body.split, body.index))},
            "task_range": lambda env: {
                "tasks": [_dump(t) for t in task_range(env, body.split, body.start, body.stop)]
            },
        }
        return await self._answer(env_name, queries[route])

    async def _answer(
        self, env_name: str, query: Callable[[Environment[Any, Any, Any]], Any]
    ) -> JSONResponse:
        try:
            return JSONResponse(await self.run(env_name, query))
        except CorralError as exc:
            self.service.manager.stats.error(str(exc.code))
            return _error(exc)

    async def run(self, env_name: str, query: Callable[[Environment[Any, Any, Any]], T]) -> T:
        """``query(env)`` in a worker thread, after checking ``env_name``.

        Raises:
            InvalidArgument: an unknown environment name, or one without tasks.
            FactoryError: the environment could not be made.
        """
        if env_name.lower() not in self.names():
            raise InvalidArgument(
                f"unknown environment {env_name!r}; this server serves "
                f"{self.service.contract.name!r}",
                details={"reason": "unknown_environment", "environments": self.listed()},
            )
        if not self.service.env_type.has_tasks():
            raise InvalidArgument(
                f"{self.service.contract.name} publishes no tasks",
                details={"reason": "no_tasks"},
            )
        env = await self._instance()
        return await run_in_threadpool(query, env)

    async def _instance(self) -> Environment[Any, Any, Any]:
        async with self._lock:
            if self._env is None:
                try:
                    made = await run_in_threadpool(self.service.manager.factory)
                except Exception as exc:
                    raise FactoryError(
                        f"the environment could not be made to answer task queries: "
                        f"{type(exc).__name__}: {exc}"
                    ) from None
                self._env = made
            return self._env

    def listed(self) -> list[str]:
        """The environments listed by ``/list_environments`` (this one)."""
        return [self.service.contract.name]

    async def close(self) -> None:
        """Close the instance, if one was made."""
        async with self._lock:
            env, self._env = self._env, None
        if env is not None:
            await run_in_threadpool(env.close)


def tasks_router(answers: TaskAnswers) -> APIRouter:
    """The task routes, each defined once and answered by ``answers``."""
    router = APIRouter(tags=["Task API"])

    @router.get("/list_environments")
    async def list_environments() -> Response:
        """The environments this server serves (one)."""
        return await answers.list_environments()

    @router.get("/{env_name}/splits", **answers.docs("splits"))
    async def splits(env_name: str) -> Response:
        """The task splits, as ``{"name", "type"}``."""
        return await answers.splits(env_name)

    for route, summary in (
        ("tasks", "Every task of a split"),
        ("num_tasks", "How many tasks a split holds"),
        ("task", "One task"),
        ("task_range", "The tasks start:stop of a split"),
    ):
        router.add_api_route(
            f"/{{env_name}}/{route}",
            with_body(_handler(answers, route), "body", answers.body(route)),
            methods=["POST"],
            summary=summary,
            name=route,
            **answers.docs(route),
        )
    return router


def _handler(answers: TaskAnswers, route: str) -> Callable[..., Awaitable[Response]]:
    async def handler(env_name: str, body: Any) -> Response:
        return await answers.answer(route, env_name, body)

    return handler


def _dump(task: BaseModel) -> dict[str, Any]:
    return task.model_dump(mode="json")


def _error(exc: CorralError) -> JSONResponse:
    reason = exc.details.get("reason")
    status = _STATUS_BY_REASON.get(str(reason), 400 if isinstance(exc, InvalidArgument) else 500)
    return error_response(exc, status)
