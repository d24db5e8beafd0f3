"""Recording episodes by hand in tests (what the client's ``record=`` does for users)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from corral.client import AsyncEnvClient
from corral.episodes import EpisodeRecorder
from corral.errors import CorralError


async def play(
    client: AsyncEnvClient[Any, Any, Any],
    recorder: EpisodeRecorder,
    seed: int | None,
    *,
    actions: Sequence[Any] | None = None,
    policy: Callable[[Any], Any] | None = None,
    options: dict[str, Any] | None = None,
    states: bool = False,
) -> str:
    """One episode (the given actions, or ``policy`` until the end), every request recorded;
    returns the episode id."""
    await client.connect()
    session = client.session_id or "?"
    options = dict(options or {})
    started = time.time()
    result = await client.reset(seed=seed, **options)
    episode = recorder.reset(
        session,
        seed=seed,
        options=options,
        observation=result.observation,
        t=started,
        latency_s=time.time() - started,
        state=await client.state() if states else None,
    )
    queue = list(actions) if actions is not None else None
    while not result.done and (queue is None or queue):
        action = queue.pop(0) if queue is not None else policy(result.observation)  # type: ignore[misc]
        started = time.time()
        try:
            result = await client.step(action)
        except CorralError as exc:
            recorder.step(session, action=action, error=exc, t=started)
            continue
        recorder.step(
            session,
            action=action,
            observation=result.observation,
            t=started,
            latency_s=time.time() - started,
            state=await client.state() if states else None,
        )
    return episode
