"""Warm starts: servers forked from a template behave as fresh ``corral serve`` processes.

Real processes throughout: a template, its forks, and owners that die.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import resource
import select
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.support.servers import alive, wait_dead

from corral.client import AsyncEnvClient
from corral.client.local_server import LocalServer
from corral.client.warm_start import (
    UNKNOWN_STATUS,
    WARM_START_ENV,
    ChildSetup,
    TemplateError,
    WarmProcess,
    WarmTemplate,
    enabled,
    reaped_cpu_seconds,
    startup_key,
    warm_template,
)
from corral.errors import ErrorCode, ServerStartError

WHERE_ENV = textwrap.dedent(
    """
    import os, resource, sys
    from corral.contract import Action, Environment, Observation, State

    class Look(Action):
        pass

    class Seen(Observation):
        cwd: str
        marker: str | None
        path0: str
        fds: list[str]
        nofile: int
        nice: int

    class WhereEnv(Environment[Look, Seen, State]):
        def reset(self, seed=None, **options):
            fds = sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                         if os.path.exists(f"/proc/self/fd/{fd}"))
            return Seen(cwd=os.getcwd(), marker=os.environ.get("CORRAL_TEST_MARKER"),
                        path0=sys.path[0], fds=fds,
                        nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[0], nice=os.nice(0))

        def step(self, action):
            return self.reset()

        def state(self):
            return State()
    """
)


async def look(url: str) -> dict[str, object]:
    client: AsyncEnvClient[Any, Any, Any]
    async with AsyncEnvClient(url) as client:
        result: Any = await client.reset()
    seen: dict[str, object] = result.observation.model_dump()
    return seen


@pytest.fixture(autouse=True)
def warm_starts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WARM_START_ENV, raising=False)


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    # Written after the worker's template may already run: a fork must still find it.
    (tmp_path / "where_env_for_tests.py").write_text(WHERE_ENV)
    return tmp_path


async def test_a_warm_server_takes_its_own_cwd_environment_and_path(env_dir: Path) -> None:
    server = LocalServer(
        "where_env_for_tests:WhereEnv", cwd=env_dir, env={"CORRAL_TEST_MARKER": "first"}
    )
    other = LocalServer(
        "where_env_for_tests:WhereEnv", cwd=env_dir, env={"CORRAL_TEST_MARKER": "second"}
    )
    try:
        seen = [await look(await s.start()) for s in (server, other)]
        assert isinstance(server.process, WarmProcess)
        assert isinstance(other.process, WarmProcess)
        assert [s["marker"] for s in seen] == ["first", "second"]
        assert {s["cwd"] for s in seen} == {str(env_dir)}
        assert {s["path0"] for s in seen} == {str(env_dir)}
    finally:
        await server.stop()
        await other.stop()


async def test_a_warm_server_holds_only_its_own_descriptors(env_dir: Path) -> None:
    # Nothing of the template (its control socket, its wake-up pipe) nor of the owner
    # reaches the server: it holds what a cold server of the same target holds.
    warm = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir)
    cold = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir, env={WARM_START_ENV: "0"})
    try:
        warm_fds = (await look(await warm.start()))["fds"]
        cold_fds = (await look(await cold.start()))["fds"]
        assert isinstance(warm.process, WarmProcess)
        assert isinstance(cold.process, subprocess.Popen)
        assert isinstance(warm_fds, list) and isinstance(cold_fds, list)

        def kinds(fds: list[str]) -> list[str]:
            return sorted(fd.split(":")[0] if ":" in fd else "file" for fd in fds)

        assert kinds(warm_fds) == kinds(cold_fds), (warm_fds, cold_fds)
    finally:
        await warm.stop()
        await cold.stop()


async def test_a_warm_server_serves_on_an_inherited_socket(env_dir: Path) -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir, listen_socket=sock)
    try:
        url = await server.start()
        assert url == f"http://127.0.0.1:{port}"
        assert isinstance(server.process, WarmProcess)
        assert (await look(url))["cwd"] == str(env_dir)
    finally:
        await server.stop()


async def test_stop_reports_the_exit_status_and_restart_forks_again(env_dir: Path) -> None:
    server = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir)
    await server.start()
    process = server.process
    assert isinstance(process, WarmProcess)
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.05)
    before = reaped_cpu_seconds()
    await server.stop()
    assert process.returncode == -signal.SIGTERM
    # Its CPU is counted where getrusage(RUSAGE_CHILDREN) cannot see it.
    assert reaped_cpu_seconds() > before
    assert not alive(process.pid)
    process.kill()  # a signal to an exited server is a no-op, never another process's
    await server.start()
    try:
        assert server.process is not process and isinstance(server.process, WarmProcess)
        assert server.running
    finally:
        await server.stop()


async def test_a_crash_at_startup_carries_the_output_as_a_cold_one_does(tmp_path: Path) -> None:
    (tmp_path / "broken_env_for_tests.py").write_text("raise RuntimeError('broken on import')\n")
    server = LocalServer("broken_env_for_tests:Env", cwd=tmp_path, startup_timeout=60)
    with pytest.raises(Exception, match="broken on import") as caught:
        await server.start()
    assert "exited with code" in str(caught.value)
    assert isinstance(server.process, WarmProcess)


@pytest.mark.parametrize("warm", ["1", "0"])
async def test_limits_and_niceness_hold_warm_and_cold(env_dir: Path, warm: str) -> None:
    setup = ChildSetup(((resource.RLIMIT_NOFILE, (200, 200)),), nice=2)
    server = LocalServer(
        "where_env_for_tests:WhereEnv", cwd=env_dir, setup=setup, env={WARM_START_ENV: warm}
    )
    try:
        seen = await look(await server.start())
        kind = WarmProcess if warm == "1" else subprocess.Popen
        assert isinstance(server.process, kind)
        assert seen["nofile"] == 200
        assert seen["nice"] == os.nice(0) + 2
    finally:
        await server.stop()


def test_a_request_too_large_for_a_warm_start_is_refused_clearly() -> None:
    # More descriptors than one message carries: a clear ServerStartError (its stable
    # code); LocalServer then starts the server cold.
    template = WarmTemplate(sys.executable, dict(os.environ))
    with pytest.raises(TemplateError, match="too large for a warm start") as caught:
        template.spawn(["--version"], env={}, cwd=None, stdout=1, pass_fds=list(range(3, 40)))
    assert isinstance(caught.value, ServerStartError)
    assert caught.value.code == ErrorCode.CONNECTION_LOST


def test_startup_variables_choose_the_template() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root", "PYTHONUNBUFFERED": "1"}
    assert startup_key(base) == startup_key({**base, "PATH": "/bin", "OTHER": "x"})
    assert startup_key(base) == startup_key({**base, "PYTHONUNBUFFERED": "0"})
    for name, value in [
        ("PYTHONPATH", "/x"),
        ("LD_PRELOAD", "/y.so"),
        ("LC_ALL", "C"),
        ("HOME", "/tmp"),
        ("PYTHONHASHSEED", "0"),
    ]:
        assert startup_key(base) != startup_key({**base, name: value}), name
    python = sys.executable
    assert warm_template(python, base) is warm_template(python, {**base, "OTHER": "x"})
    assert warm_template(python, base) is not warm_template(python, {**base, "PYTHONPATH": "/x"})
    assert enabled({}) and enabled({WARM_START_ENV: "1"})
    assert not enabled({WARM_START_ENV: "0"}) and not enabled({WARM_START_ENV: "off"})


async def test_warm_start_off_starts_a_fresh_interpreter(env_dir: Path) -> None:
    server = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir, env={WARM_START_ENV: "0"})
    try:
        await server.start()
        assert isinstance(server.process, subprocess.Popen)
    finally:
        await server.stop()


async def test_an_interpreter_that_cannot_be_a_template_starts_cold(
    env_dir: Path, tmp_path: Path
) -> None:
    # This "interpreter" refuses to run a template (-c) but serves (-m): the server must
    # still start, cold.
    python = tmp_path / "python"
    tries = tmp_path / "tries"
    python.write_text(
        f'#!/bin/sh\n[ "$1" = "-c" ] && echo >> {tries} && exit 3\nexec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    server = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir, python=str(python))
    try:
        await look(await server.start())
        assert isinstance(server.process, subprocess.Popen)
    finally:
        await server.stop()
    # Once found broken, the template is not tried again by the next server.
    again = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir, python=str(python))
    try:
        await again.start()
        assert isinstance(again.process, subprocess.Popen)
    finally:
        await again.stop()
    assert tries.read_text().count("\n") == 1
    with pytest.raises(TemplateError, match="did not start"):
        WarmTemplate(str(python), dict(os.environ)).start(timeout=60)


def test_servers_die_with_a_dead_template(env_dir: Path) -> None:
    template = WarmTemplate(sys.executable, {**os.environ, "CORRAL_TEST_OWN_TEMPLATE": "1"})
    read, write = os.pipe()
    try:
        process = template.spawn(
            ["serve", "where_env_for_tests:WhereEnv", "--port", "0"],
            env=dict(os.environ),
            cwd=str(env_dir),
            stdout=write,
        )
        assert process.poll() is None
        template.close()
        assert process.wait(60) == UNKNOWN_STATUS
        assert wait_dead(process.pid)
        # The next request starts a new template.
        again = template.spawn(["--version"], env=dict(os.environ), cwd=None, stdout=write)
        assert again.wait(60) == 0
    finally:
        template.close()
        os.close(write)
        os.close(read)


OWNER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from corral.client.local_server import LocalServer

    async def main():
        server = LocalServer("where_env_for_tests:WhereEnv", cwd=sys.argv[1])
        await server.start()
        template = int(open(f"/proc/{server.process.pid}/stat").read().split(")")[1].split()[1])
        print(type(server.process).__name__, server.process.pid, template, flush=True)
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_no_warm_server_or_template_outlives_its_owner(env_dir: Path, how: str) -> None:
    script = env_dir / "owner.py"
    script.write_text(OWNER)
    done = subprocess.run(
        [sys.executable, str(script), str(env_dir), how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    kind, server, template = done.stdout.split()
    assert kind == "WarmProcess", done.stderr
    assert wait_dead(int(template)), f"the template outlived its owner ({how})"
    assert wait_dead(int(server)), f"the warm server outlived its owner ({how})"


def _template_of_a_server(env_dir: str, found: Any) -> None:
    async def main() -> tuple[int, int]:
        server = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir)
        await server.start()
        try:
            assert server.process is not None
            template = parent_of(server.process.pid)
            return template, parent_of(template)
        finally:
            await server.stop()

    found.put(asyncio.run(main()))


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_a_forked_process_starts_its_own_template(env_dir: Path) -> None:
    # A fork of a process holding a template (multiprocessing's "fork", say) must not
    # talk to the parent's template over the socket it inherited.
    server = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir)
    await server.start()
    try:
        assert server.process is not None
        ours = parent_of(server.process.pid)
        context = multiprocessing.get_context("fork")
        found = context.Queue()
        child = context.Process(target=_template_of_a_server, args=(str(env_dir), found))
        child.start()
        theirs, its_parent = await asyncio.to_thread(found.get, True, 120)
        await asyncio.to_thread(child.join, 60)
        assert child.exitcode == 0
        assert theirs != ours
        assert its_parent == child.pid  # the child's own template
    finally:
        await server.stop()


async def test_poll_says_exited_as_soon_as_the_kernel_does(env_dir: Path) -> None:
    # As Popen.poll's waitpid does: a server the kernel has seen exit is not "running",
    # even while its template's report is still on the way (held back here by stopping
    # the template until the poll is under way).
    server = LocalServer("where_env_for_tests:WhereEnv", cwd=env_dir)
    await server.start()
    process = server.process
    assert isinstance(process, WarmProcess)
    template = parent_of(process.pid)
    os.kill(template, signal.SIGSTOP)
    try:
        os.kill(process.pid, signal.SIGKILL)
        pidfd = os.pidfd_open(process.pid)
        try:
            assert select.select([pidfd], [], [], 60)[0]  # the kernel: it has exited
        finally:
            os.close(pidfd)
        resume = threading.Timer(0.2, os.kill, (template, signal.SIGCONT))
        resume.start()
        assert process.poll() == -signal.SIGKILL
        assert not server.running
        resume.join()
    finally:
        os.kill(template, signal.SIGCONT)
        await server.stop()
