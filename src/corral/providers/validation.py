"""The runtime smoke test of an environment, through a provider.

:func:`smoke_test` starts the environment with a :class:`~corral.providers.base.Provider`
(a local process, or a built image in Docker), plays short episodes through corral's
client with both codecs, and reports one :class:`Finding` per check:

* ``start``: the server starts and answers ``/ready``;
* ``contract``: the served contract (version and schema fingerprint, from the
  handshake) is the one of the models in the source; a stale image fails here;
* ``episode.msgpack`` / ``episode.json``: reset, steps and state succeed and decode into
  the contract's models;
* ``roundtrip``: every model (the action, each observation, the state) survives
  encoding and decoding with both codecs unchanged, and both codecs deliver the same
  observations;
* ``determinism``: the same seed and actions give the same observations (``metadata``
  included) and the same state (``episode_id`` aside);
* ``reward``: rewards are finite numbers or ``None``; an episode does not start done;
  ``state().step_count`` counts the steps; a step after the episode ended is refused
  with ``EPISODE_ENDED`` (unless the environment resets automatically);
* ``stop``: the provider stops the server and nothing keeps running.

The action played at every step is given by the caller (the CLI synthesizes one from
the action schema, or takes ``--action``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from corral.client import AsyncEnvClient
from corral.contract import Environment, Observation
from corral.episodes import EpisodeRecorder, Header, collect, compare, first_difference
from corral.episodes.files import AnyLine
from corral.errors import CorralError, EpisodeEnded
from corral.protocol.codecs import get_codec
from corral.providers.base import Endpoint, Provider, SpecLike

CODECS = ("msgpack", "json")


@dataclass(frozen=True)
class Finding:
    """The outcome of one runtime check.

    Attributes:
        id: a stable id, e.g. ``episode.json``.
        title: what was checked.
        ok: True (passed), False (failed) or None (skipped: it did not apply).
        detail: why it failed or was skipped, or a short measurement.
    """

    id: str
    title: str
    ok: bool | None
    detail: str = ""


@dataclass
class _Episode:
    observations: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    ended: bool = False
    steps: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    models: list[BaseModel] = field(default_factory=list)
    after_end: str = ""
    lines: list[AnyLine] = field(default_factory=list)
    """The episode in the episode format, for the determinism check (one comparison
    rule everywhere: :func:`corral.episodes.compare`)."""


class _Failed(Exception):
    """A check failed; the message says how."""


class _Skipped(Exception):
    """A check does not apply; the message says why."""


class _Smoke:
    def __init__(
        self,
        provider: Provider,
        spec: SpecLike,
        env: type[Environment[Any, Any, Any]] | None,
        action: Mapping[str, Any],
        seed: int,
        steps: int,
        timeout: float,
    ) -> None:
        self.provider = provider
        self.spec = spec
        self.env = env
        self.action = dict(action)
        self.seed = seed
        self.steps = steps
        self.timeout = timeout
        self.findings: list[Finding] = []
        self.endpoint: Endpoint | None = None
        self.episodes: dict[str, list[_Episode]] = {}
        self.welcome: dict[str, Any] = {}

    async def check(self, cid: str, title: str, body: Callable[[], Awaitable[str]]) -> bool:
        try:
            detail = await body()
        except _Skipped as exc:
            self.findings.append(Finding(cid, title, None, str(exc)))
            return False
        except (_Failed, CorralError, OSError, TimeoutError, ValueError) as exc:
            message = exc.message if isinstance(exc, CorralError) else str(exc)
            kind = "" if isinstance(exc, _Failed) else f"{type(exc).__name__}: "
            self.findings.append(Finding(cid, title, False, f"{kind}{message}"))
            return False
        self.findings.append(Finding(cid, title, True, detail))
        return True

    # -- the checks ----------------------------------------------------------------

    async def start(self) -> str:
        started = time.monotonic()
        self.endpoint = await self.provider.start(self.spec)
        return f"{self.endpoint.url} ready in {time.monotonic() - started:.2f} s"

    def client(self, codec: str) -> AsyncEnvClient[Any, Any, Any]:
        assert self.endpoint is not None
        return AsyncEnvClient(
            self.endpoint.url,
            env=self.env,
            codec=codec,
            timeout=self.timeout,
            connect_timeout=self.timeout,
            # The contract is compared explicitly (and reported) by the contract check.
            check_contract=False,
            openenv_fallback=False,
            # A server that crashes must fail the check at once, not be waited for.
            reconnect=False,
            token=self.provider.token,
        )

    async def contract(self) -> str:
        async with self.client("msgpack") as client:
            self.welcome = client.server_info
        served = self.welcome.get("env") or {}
        if self.env is None:
            raise _Skipped("no local models to compare with")
        local = self.env.contract()
        problems = []
        if served.get("fingerprint") != local.fingerprint:
            problems.append(
                f"the server's schema fingerprint {served.get('fingerprint')} is not the "
                f"source's {local.fingerprint}"
            )
        if served.get("contract_version") != local.version:
            problems.append(
                f"the server's contract version {served.get('contract_version')} is not the "
                f"source's {local.version}"
            )
        if problems:
            raise _Failed("; ".join(problems) + " (rebuild the image with 'corral build')")
        return f"contract {local.version}, {local.fingerprint}"

    async def play(self, codec: str) -> _Episode:
        episode = _Episode()
        recorder = EpisodeRecorder(episode.lines.append, new_id=lambda: f"with seed {self.seed}")
        async with self.client(codec) as client:
            first = await client.reset(seed=self.seed)
            recorder.reset("validate", seed=self.seed, observation=first.observation)
            self._record(client, episode, first.observation)
            for _ in range(self.steps):
                if episode.ended:
                    break
                result = await client.step(self.action)
                recorder.step("validate", action=self.action, observation=result.observation)
                episode.steps += 1
                self._record(client, episode, result.observation)
                episode.rewards.append(result.reward)
                episode.ended = result.done
            state = await client.state()
            self._typed(client.state_type, state, "state")
            episode.models.append(state)
            episode.state = state.model_dump(mode="json")
            assert client.action_type is not None
            episode.models.append(client.action_type.model_validate(self.action))
            if episode.ended and not (self.env is not None and self.env.auto_reset):
                try:
                    await client.step(self.action)
                    episode.after_end = "accepted"
                except EpisodeEnded:
                    episode.after_end = "refused"
        return episode

    def _record(
        self, client: AsyncEnvClient[Any, Any, Any], episode: _Episode, obs: Observation
    ) -> None:
        self._typed(client.observation_type, obs, "observation")
        episode.models.append(obs)
        episode.observations.append(obs.model_dump(mode="json"))

    @staticmethod
    def _typed(model: type[Any] | None, value: Any, what: str) -> None:
        if model is not None and not isinstance(value, model):
            raise _Failed(f"the {what} decoded as {type(value).__name__}, not {model.__name__}")

    def episode_check(self, codec: str) -> Callable[[], Awaitable[str]]:
        async def body() -> str:
            runs = [await self.play(codec)]
            if codec == "msgpack":
                runs.append(await self.play(codec))
            self.episodes[codec] = runs
            first = runs[0]
            end = "ended" if first.ended else "still running"
            return f"reset + {first.steps} step(s) + state; {end}"

        return body

    async def roundtrip(self) -> str:
        if not self.episodes:
            raise _Skipped("no episode was played")
        models = [m for runs in self.episodes.values() for m in runs[0].models]
        for name in CODECS:
            codec = get_codec(name)
            for model in models:
                frame = codec.encode({"value": codec.dump(model)})
                back = codec.load(type(model), codec.decode(frame)["value"])
                if back != model:
                    where = first_difference(
                        back.model_dump(mode="json"), model.model_dump(mode="json")
                    )
                    raise _Failed(
                        f"a {type(model).__name__} changed through the {name} codec "
                        f"(at {where or 'a value that dumps identically'})"
                    )
        if "msgpack" in self.episodes and "json" in self.episodes:
            a = self.episodes["msgpack"][0].observations
            b = self.episodes["json"][0].observations
            where = first_difference(a, b)
            if where is not None:
                raise _Failed(f"msgpack and JSON delivered different observations (at {where})")
        kinds = sorted({type(m).__name__ for m in models})
        return f"{len(models)} values ({', '.join(kinds)}) x {len(CODECS)} codecs"

    async def determinism(self) -> str:
        runs = self.episodes.get("msgpack", [])
        if len(runs) < 2:
            raise _Skipped("the msgpack episodes did not run")
        a, b = runs[0], runs[1]
        (first,) = collect(a.lines, Header())
        (second,) = collect(b.lines, Header())
        found = compare(first, second)
        if found is not None:
            raise _Failed(
                f"the same seed gave different observations in two episodes: {found}; "
                "derive all randomness from the seed given to reset()"
            )
        state_a = {k: v for k, v in a.state.items() if k != "episode_id"}
        state_b = {k: v for k, v in b.state.items() if k != "episode_id"}
        where = first_difference(state_a, state_b)
        if where is not None:
            raise _Failed(f"seed {self.seed} gave different states (at {where})")
        return f"seed {self.seed}: {len(a.observations)} identical observations"

    async def reward(self) -> str:
        runs = self.episodes.get("msgpack") or self.episodes.get("json")
        if not runs:
            raise _Skipped("no episode was played")
        episode = runs[0]
        first = episode.observations[0]
        if first.get("done"):
            raise _Failed("reset() returned an observation that is already done")
        for i, reward in enumerate(episode.rewards, 1):
            if reward is not None and not math.isfinite(reward):
                raise _Failed(f"step {i} returned reward {reward}; rewards must be finite")
        count = episode.state.get("step_count")
        if isinstance(count, int) and count != episode.steps:
            raise _Failed(
                f"state().step_count is {count} after {episode.steps} step(s); increment "
                "it in step()"
            )
        if episode.after_end == "accepted":
            raise _Failed(
                "a step after the episode ended was accepted; the server should refuse it "
                "with EPISODE_ENDED (or set auto_reset = True)"
            )
        numbers = [r for r in episode.rewards if r is not None]
        total = f"return {sum(numbers):g}" if numbers else "no rewards"
        ended = "ended, then refused a step" if episode.after_end else "did not end"
        return f"{total} over {episode.steps} step(s); {ended}"

    async def stop(self) -> str:
        if self.endpoint is None:
            raise _Skipped("the server did not start")
        await self.provider.stop(self.endpoint)
        if await self.provider.alive(self.endpoint):
            raise _Failed(f"server {self.endpoint.id} is still running after stop()")
        return f"server {self.endpoint.id[:12]} stopped"

    async def run(self) -> list[Finding]:
        try:
            if await self.check("start", "the server starts and is ready", self.start):
                await self.check("contract", "the served contract is the source's", self.contract)
                for codec in CODECS:
                    await self.check(
                        f"episode.{codec}",
                        f"reset/step/state over {codec}",
                        self.episode_check(codec),
                    )
                await self.check(
                    "roundtrip", "every model round-trips (both codecs)", self.roundtrip
                )
                await self.check("determinism", "same seed, same observations", self.determinism)
                await self.check("reward", "reward and termination sanity", self.reward)
        finally:
            await self.check("stop", "the provider stops the server", self.stop)
        return self.findings


async def smoke_test(
    provider: Provider,
    spec: SpecLike,
    action: Mapping[str, Any],
    *,
    env: type[Environment[Any, Any, Any]] | None = None,
    seed: int = 0,
    steps: int = 20,
    timeout: float = 30.0,
) -> list[Finding]:
    """Start ``spec`` with ``provider`` and run the runtime checks (module docstring).

    Args:
        provider: where the server runs; the server is stopped before this returns.
        spec: what to start (an environment directory, an entry point, an image).
        action: a valid action (as JSON), played at every step.
        env: the environment class from the source: its models decode replies and its
            contract is compared with the served one (None: models from the schema).
        seed: the seed of every episode.
        steps: the most steps an episode is played for.
        timeout: seconds any single request may take.

    Returns:
        One finding per check, in order; a check that could not run is skipped.
    """
    smoke = _Smoke(provider, spec, env, action, seed, steps, timeout)
    return await smoke.run()
