"""LocalProcessProvider against real server processes: lifecycle, cleanup, limits, sandboxes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from tests.support.servers import alive, wait_dead

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction, EchoEnv
from corral.errors import ConnectionLost, CorralError, EnvError, ServerStartError
from corral.providers.base import ServerSpec
from corral.providers.guardian import guardian
from corral.providers.local import LocalEndpoint, LocalLimits, LocalProcessProvider
from corral.sandbox import SandboxMode, available_modes

ECHO = "corral.envs.echo:EchoEnv"

HOG = """
import os, socket, time
from corral.contract import Action, Environment, Observation, State


class HogAction(Action):
    mebibytes: int = 0
    cpu_seconds: float = 0.0
    probe: str = ""


class HogObservation(Observation):
    allocated: int = 0
    answer: str = ""


class HogEnv(Environment[HogAction, HogObservation, State]):
    def reset(self, seed=None, **options):
        self.hold = None
        return HogObservation()

    def step(self, action):
        if action.mebibytes:
            self.hold = bytearray(action.mebibytes * 2**20)
        end = time.process_time() + action.cpu_seconds
        while time.process_time() < end:
            pass
        answer = ""
        if action.probe == "network":
            try:
                socket.create_connection(("1.1.1.1", 53), timeout=2).close()
                answer = "connected"
            except OSError as exc:
                answer = f"refused: {exc}"
        elif action.probe == "identity":
            answer = f"{os.uname().nodename} {os.getpid()} {os.environ.get('HOME')}"
        elif action.probe.startswith("write:"):
            path = action.probe.split(":", 1)[1]
            try:
                with open(path, "w") as f:
                    f.write("x")
                answer = "written"
            except OSError as exc:
                answer = f"refused: {exc.strerror}"
        elif action.probe.startswith("read:"):
            answer = str(os.path.exists(action.probe.split(":", 1)[1]))
        return HogObservation(allocated=len(self.hold or b""), answer=answer)

    def state(self):
        return State()
"""


@pytest.fixture(scope="module")
def hog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hog")
    (directory / "hog_env_for_tests.py").write_text(HOG)
    return directory


def hog_action(**fields: object) -> dict[str, object]:
    return {"mebibytes": 0, "cpu_seconds": 0.0, "probe": "", **fields}


async def test_start_serves_and_stop_kills(tmp_path: Path) -> None:
    provider = LocalProcessProvider()
    endpoint = await provider.start(ECHO)
    assert isinstance(endpoint, LocalEndpoint)
    assert endpoint.url == f"http://127.0.0.1:{endpoint.port}" and endpoint.sandbox == "none"
    assert provider.endpoints == [endpoint] and provider.running == [str(endpoint.pid)]
    assert await provider.alive(endpoint) and await provider.healthy(endpoint)
    await provider.wait_ready(endpoint)
    async with AsyncEnvClient(endpoint.url, env=EchoEnv) as env:
        await env.reset()
        assert (await env.step(EchoAction(message="hi"))).observation.echoed_message == "hi"
    await provider.stop(endpoint)
    assert wait_dead(endpoint.pid)
    assert provider.endpoints == [] and not await provider.alive(endpoint)
    # Nothing listens any more: the provider's copy of the socket was closed too.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{endpoint.url}/health", timeout=2)
    await provider.close()
    with pytest.raises(ServerStartError, match="provider is closed"):
        await provider.start(ECHO)


async def test_an_environment_directory_uses_its_manifest(echo_env_dir: Path) -> None:
    async with LocalProcessProvider() as provider:
        endpoint = await provider.start(echo_env_dir)
        ready = httpx.get(f"{endpoint.url}/ready", timeout=5).json()
        assert ready["max_sessions"] == 8  # the manifest's concurrency
        assert endpoint.target == str(echo_env_dir)
        spec = ServerSpec(str(echo_env_dir), max_sessions=3)
        other = await provider.start(spec)
        assert httpx.get(f"{other.url}/ready", timeout=5).json()["max_sessions"] == 3
        pids = [endpoint.pid, other.pid]
    # Context exit stopped both.
    assert all(wait_dead(pid) for pid in pids)


async def test_the_trainer_that_starts_a_server_may_fill_it() -> None:
    """Issue 30.4's share keeps room for other clients of a shared server; a server a
    provider starts for its caller has none, so its one client takes every slot (16 of
    16: the share would stop it at 14), unless the spec's own options say otherwise."""
    assert ServerSpec(ECHO).serve_args(owned=True) == ["--max-sessions-per-client", "0"]
    mine = ServerSpec(ECHO, server_args=("--max-sessions-per-client", "3"))
    assert mine.serve_args(owned=True) == ["--max-sessions-per-client", "3"]
    assert ServerSpec(ECHO).serve_args() == []
    async with LocalProcessProvider() as provider:
        endpoint = await provider.start(ServerSpec(ECHO, max_sessions=16))
        with httpx.Client(base_url=endpoint.url, timeout=30) as web:
            opened = [web.post("/sessions").status_code for _ in range(16)]
            assert opened == [201] * 16, opened
            assert web.post("/sessions").json()["code"] == "CAPACITY_REACHED"


async def test_a_crash_at_startup_carries_the_output() -> None:
    async with LocalProcessProvider() as provider:
        with pytest.raises(ServerStartError, match="NoSuchEnv") as info:
            await provider.start("corral.envs.echo:NoSuchEnv")
        assert "exited with code" in info.value.message
        assert provider.endpoints == []


async def test_a_cancelled_start_leaves_nothing(tmp_path: Path) -> None:
    slow = tmp_path / "slow_env_for_tests.py"
    slow.write_text("import time\ntime.sleep(60)\nfrom corral.envs.echo import EchoEnv\n")
    provider = LocalProcessProvider(cwd=tmp_path)
    task = asyncio.create_task(provider.start("slow_env_for_tests:EchoEnv"))
    deadline = time.monotonic() + 60
    while not provider._servers and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    ((pid, _),) = provider._servers.items()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_dead(pid) and provider._servers == {}
    await provider.close()


async def test_bad_manifest_and_venv_errors(tmp_path: Path) -> None:
    (tmp_path / "corral.yaml").write_text("name: Bad Name\nentry_point: x:Y\n")
    async with LocalProcessProvider() as provider:
        with pytest.raises(ServerStartError, match="is not a valid name"):
            await provider.start(tmp_path)
    async with LocalProcessProvider(venv=True) as provider:
        with pytest.raises(ServerStartError, match="venv=True builds the virtualenv"):
            await provider.start(ECHO)
    with pytest.raises(ValueError, match="sandbox must be"):
        LocalProcessProvider(sandbox="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive integer"):
        LocalLimits(cpu_seconds=0)


def test_sync_twin(echo_env_dir: Path) -> None:
    with LocalProcessProvider().sync() as provider:
        endpoint = provider.start(echo_env_dir)
        assert provider.alive(endpoint) and provider.healthy(endpoint)
        provider.wait_ready(endpoint, timeout=5)
        assert provider.running == [endpoint.id]
        provider.stop(endpoint)
        assert provider.endpoints == [] and not provider.alive(endpoint)
        assert provider.logs(endpoint) == ""
        again = provider.start(ECHO)
    assert wait_dead(again.pid)


def test_a_forgotten_provider_stops_its_servers() -> None:
    import gc

    provider = LocalProcessProvider().sync()
    endpoint = provider.start(ECHO)
    del provider
    gc.collect()
    assert wait_dead(endpoint.pid)


CHILD = """
import os, signal, sys
from corral.providers.local import LocalProcessProvider

provider = LocalProcessProvider(sandbox={sandbox!r}).sync()
endpoint = provider.start("corral.envs.echo:EchoEnv")
print(endpoint.pid, endpoint.port, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def sandbox_works(mode: str) -> bool:
    return available_modes()[SandboxMode(mode)] is None


@pytest.mark.parametrize(
    ("how", "sandbox"), [("exit", "none"), ("kill", "none"), ("kill", "bwrap"), ("kill", "unshare")]
)
def test_no_orphans_after_exit_or_sigkill(tmp_path: Path, how: str, sandbox: str) -> None:
    if sandbox != "none" and not sandbox_works(sandbox):
        pytest.skip(f"{sandbox} does not work here")
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(sandbox=sandbox))
    done = subprocess.run(
        [sys.executable, str(script), how], capture_output=True, text=True, timeout=60
    )
    assert done.stdout, done.stderr
    pid, port = map(int, done.stdout.split())
    assert wait_dead(pid), f"server {pid} outlived its parent ({how}, {sandbox})"
    # The sandboxed server itself (not only bwrap or unshare) is gone: the port is free.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
        except httpx.HTTPError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"something still serves on port {port}")


def test_the_guardian_stops_what_pdeathsig_missed(tmp_path: Path) -> None:
    # A server that ignores SIGTERM and has no parent-death signal (started by another
    # tool): only the guardian's SIGKILL, after its grace period, can stop it.
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, subprocess, sys, time
            from corral.providers.guardian import guardian
            stubborn = subprocess.Popen(
                [sys.executable, "-c",
                 "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                 "print('ignoring SIGTERM', flush=True); time.sleep(120)"],
                start_new_session=True, stdout=subprocess.PIPE,
            )
            stubborn.stdout.readline()  # SIGTERM is ignored from now on
            guardian().watch(stubborn.pid)
            print(stubborn.pid, guardian().pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pid, guard_pid = map(int, done.stdout.split())
    assert wait_dead(pid), "the guardian did not kill the stubborn process"
    assert wait_dead(guard_pid), "the guardian did not exit after cleaning up"


def test_the_guardian_spares_a_released_process() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        handle = guardian()
        handle.watch(sleeper.pid)
        handle.release(sleeper.pid)
        assert handle.pid is not None and alive(handle.pid)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_memory_limit(hog_dir: Path) -> None:
    limits = LocalLimits(memory="256Mi")
    async with LocalProcessProvider(cwd=hog_dir, limits=limits) as provider:
        endpoint = await provider.start("hog_env_for_tests:HogEnv")
        async with AsyncEnvClient(endpoint.url) as env:
            await env.reset()
            small = await env.step(hog_action(mebibytes=16))
            assert small.observation.allocated == 16 * 2**20
            with pytest.raises(EnvError, match="MemoryError"):
                await env.step(hog_action(mebibytes=512))
        # A refused allocation is an error of one step, not of the server.
        assert await provider.healthy(endpoint)


async def test_cpu_limit_kills_the_server(hog_dir: Path) -> None:
    # The budget counts the server's start-up too (about 1 CPU second, more on a loaded
    # machine): 4 seconds leave room for it, and the step asks for far more.
    limits = LocalLimits(cpu_seconds=4)
    async with LocalProcessProvider(cwd=hog_dir, limits=limits) as provider:
        endpoint = await provider.start("hog_env_for_tests:HogEnv")
        async with AsyncEnvClient(endpoint.url, timeout=300, reconnect=False) as env:
            await env.reset()
            with pytest.raises(CorralError) as info:
                await env.step(hog_action(cpu_seconds=600.0))
        assert isinstance(info.value, ConnectionLost | CorralError)
        deadline = time.monotonic() + 60
        while await provider.alive(endpoint) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not await provider.alive(endpoint)
        assert not await provider.healthy(endpoint)


@pytest.mark.parametrize("mode", ["bwrap", "unshare"])
async def test_sandbox_isolation(hog_dir: Path, tmp_path: Path, mode: str) -> None:
    if not sandbox_works(mode):
        pytest.skip(f"{mode} does not work here")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    async with LocalProcessProvider(cwd=hog_dir, sandbox=mode) as provider:  # type: ignore[arg-type]
        endpoint = await provider.start("hog_env_for_tests:HogEnv")
        assert endpoint.sandbox == mode
        async with AsyncEnvClient(endpoint.url) as env:
            await env.reset()

            async def probe(what: str) -> str:
                result = await env.step(hog_action(probe=what))
                return str(result.observation.answer)

            # No network: not even the host's loopback, although the client reaches it.
            assert (await probe("network")).startswith("refused")
            host, pid, home = (await probe("identity")).split()
            assert host == "sandbox" and home == "/workspace"
            assert int(pid) < 100  # a pid namespace of its own
            # Read-only root and environment directory; private, writable /tmp and HOME.
            assert (await probe(f"write:{hog_dir}/x")).startswith("refused")
            assert (await probe("write:/usr/x")).startswith("refused")
            assert await probe("write:/tmp/x") == "written"
            assert await probe("write:/workspace/x") == "written"
            assert await probe(f"read:{outside}") == "False"
            assert await probe(f"read:{hog_dir}/hog_env_for_tests.py") == "True"
        assert not (Path("/tmp") / "x").exists()
        sandbox_dir = provider._servers[endpoint.pid][1]
        assert sandbox_dir is not None
        root = sandbox_dir.workspace.root
        assert root.exists()
        await provider.stop(endpoint)
        assert not root.exists(), "the sandbox directory outlived its server"


def test_sigterm_to_bwrap_stops_the_sandboxed_server(hog_dir: Path) -> None:
    if not sandbox_works("bwrap"):
        pytest.skip("bwrap does not work here")
    with LocalProcessProvider(cwd=hog_dir, sandbox="bwrap").sync() as provider:
        endpoint = provider.start("hog_env_for_tests:HogEnv")
        assert isinstance(endpoint, LocalEndpoint)
        os.kill(endpoint.pid, signal.SIGTERM)
        assert wait_dead(endpoint.pid)
        deadline = time.monotonic() + 60
        while provider.healthy(endpoint) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not provider.healthy(endpoint)


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
async def test_a_token_guards_the_server_and_the_provider_uses_it(sandbox: str) -> None:
    if sandbox != "none" and not sandbox_works(sandbox):
        pytest.skip(f"{sandbox} does not work here")
    token = "provider-test-token-0123456789"
    async with LocalProcessProvider(token=token, sandbox=sandbox) as provider:  # type: ignore[arg-type]
        endpoint = await provider.start(ECHO)
        assert await provider.healthy(endpoint)
        assert httpx.get(f"{endpoint.url}/health", timeout=5).status_code == 401
        async with AsyncEnvClient(endpoint.url, env=EchoEnv, token=token) as env:
            await env.reset()
            assert (await env.step(EchoAction(message="ok"))).observation.message_length == 2
