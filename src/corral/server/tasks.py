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

Errors are JSON ``{"detail", "code", "message", "details"}`` like corral's other HTTP
routes, ``code`` ``INVALID_ARGUMENT`` and ``details.reason`` saying which: ``404`` for an
unknown environment name or split, and when the environment publishes no tasks
(``no_tasks``; OpenEnv answers 501 there, a status corral keeps for its own failures),
``400`` for an index out of range or a listing too large, ``422`` for a malformed body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from corral.contract import Environment
from corral.contract.tasks import count_tasks, resolve_task, split_kind, task_range
from corral.errors import CorralError, FactoryError, InvalidArgument
from corral.server.http import error_response
from corral.server.openenv_http import ErrorReply
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
    400: {"model": ErrorReply, "description": "An index out of range, or too many tasks."},
    404: {"model": ErrorReply, "description": "No such environment or split, or no tasks."},
    500: {"model": ErrorReply, "description": "The environment could not be made."},
}


class TaskCatalog:
    """The environment instance the task routes read, made on first use."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self._env: Environment[Any, Any, Any] | None = None
        self._lock = asyncio.Lock()

    def names(self) -> set[str]:
        """The names the routes answer to (lower case)."""
        return {self.service.contract.name.lower(), self.service.env_type.__name__.lower()}

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


def tasks_router(service: EnvService) -> tuple[APIRouter, TaskCatalog]:
    """The task routes for ``service`` and the catalog to close with the app."""
    catalog = TaskCatalog(service)
    router = APIRouter(tags=["Task API"])

    async def answer(
        env_name: str, query: Callable[[Environment[Any, Any, Any]], Any]
    ) -> JSONResponse:
        try:
            return JSONResponse(await catalog.run(env_name, query))
        except CorralError as exc:
            service.manager.stats.error(str(exc.code))
            return _error(exc)

    @router.get("/list_environments")
    async def list_environments() -> list[str]:
        """The environments this server serves (one)."""
        return catalog.listed()

    @router.get("/{env_name}/splits", response_model=list[SplitInfo], responses=_ERRORS)
    async def splits(env_name: str) -> JSONResponse:
        """The task splits, as ``{"name", "type"}``."""
        return await answer(
            env_name, lambda env: [{"name": s, "type": split_kind(s)} for s in env.splits()]
        )

    @router.post("/{env_name}/tasks", response_model=TaskList, responses=_ERRORS)
    async def tasks(env_name: str, body: SplitBody) -> JSONResponse:
        """Every task of a split."""
        return await answer(
            env_name,
            lambda env: {
                "tasks": [_dump(t) for t in task_range(env, body.split)],
                "env_name": service.contract.name,
            },
        )

    @router.post("/{env_name}/num_tasks", response_model=TaskCount, responses=_ERRORS)
    async def num_tasks(env_name: str, body: SplitBody) -> JSONResponse:
        """How many tasks a split holds."""
        return await answer(env_name, lambda env: {"num_tasks": count_tasks(env, body.split)})

    @router.post("/{env_name}/task", response_model=OneTask, responses=_ERRORS)
    async def task(env_name: str, body: TaskBody) -> JSONResponse:
        """One task."""
        return await answer(
            env_name, lambda env: {"task": _dump(resolve_task(env, body.split, body.index))}
        )

    @router.post("/{env_name}/task_range", response_model=TaskSlice, responses=_ERRORS)
    async def range_(env_name: str, body: RangeBody) -> JSONResponse:
        """The tasks ``start:stop`` of a split."""
        return await answer(
            env_name,
            lambda env: {
                "tasks": [_dump(t) for t in task_range(env, body.split, body.start, body.stop)]
            },
        )

    return router, catalog


def _dump(task: BaseModel) -> dict[str, Any]:
    return task.model_dump(mode="json")


def _error(exc: CorralError) -> JSONResponse:
    reason = exc.details.get("reason")
    status = _STATUS_BY_REASON.get(str(reason), 400 if isinstance(exc, InvalidArgument) else 500)
    return error_response(exc, status)
