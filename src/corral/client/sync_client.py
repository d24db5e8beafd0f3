"""``SyncEnvClient``: the blocking twin of :class:`AsyncEnvClient`.

Same methods, same names, same exceptions; each call runs the async implementation on
a private background loop, so it works in scripts and inside Jupyter alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Generic, Self

from corral.client.async_client import ActT, AsyncEnvClient, ObsT, StateT
from corral.client.loop import run_blocking
from corral.contract import Environment, StepResult
from corral.errors import RequestTimeout

_MARGIN = 5.0
"""Seconds a blocking call waits beyond the client's own timeout before giving up."""


class SyncEnvClient(Generic[ActT, ObsT, StateT]):
    """A blocking session with a remote environment; see :class:`AsyncEnvClient`."""

    def __init__(self, client: AsyncEnvClient[ActT, ObsT, StateT]) -> None:
        self._client = client

    @classmethod
    def connect_to(cls, url: str, **kwargs: Any) -> SyncEnvClient[Any, Any, Any]:
        """Create the async client with ``kwargs`` and return its connected twin."""
        twin: SyncEnvClient[Any, Any, Any] = SyncEnvClient(AsyncEnvClient(url, **kwargs))
        return twin.connect()

    @classmethod
    def from_env(
        cls,
        target: str,
        *,
        env: type[Environment[Any, Any, Any]] | None = None,
        **kwargs: Any,
    ) -> SyncEnvClient[Any, Any, Any]:
        """Start ``target`` in a local server process and connect (blocking)."""
        client = run_blocking(AsyncEnvClient.from_env(target, env=env, **kwargs), None)
        return SyncEnvClient(client)

    @property
    def async_client(self) -> AsyncEnvClient[ActT, ObsT, StateT]:
        """The async client this twin drives."""
        return self._client

    @property
    def session_id(self) -> str | None:
        """The server's id of this session."""
        return self._client.session_id

    @property
    def server_info(self) -> dict[str, Any]:
        """The server's ``welcome``."""
        return self._client.server_info

    def _wait(self) -> float | None:
        timeout = self._client.timeout
        return None if timeout is None else timeout + _MARGIN

    def _run(self, coro: Any) -> Any:
        try:
            return run_blocking(coro, self._wait())
        except TimeoutError as exc:
            if isinstance(exc, RequestTimeout):
                raise
            raise RequestTimeout(str(exc)) from None

    def connect(self) -> Self:
        """Connect, handshake and open the session."""
        self._run(self._client.connect())
        return self

    def reset(self, seed: int | None = None, **options: Any) -> StepResult[ObsT]:
        """Start a new episode; see :meth:`AsyncEnvClient.reset`."""
        result: StepResult[ObsT] = self._run(self._client.reset(seed, **options))
        return result

    def step(self, action: ActT | Mapping[str, Any]) -> StepResult[ObsT]:
        """Apply ``action``; see :meth:`AsyncEnvClient.step`."""
        result: StepResult[ObsT] = self._run(self._client.step(action))
        return result

    def state(self) -> StateT:
        """The current state; see :meth:`AsyncEnvClient.state`."""
        state: StateT = self._run(self._client.state())
        return state

    def close(self) -> None:
        """Close the session, connection and any server the client started."""
        run_blocking(self._client.close(), 30.0)

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
