"""Run conformance scenarios against OpenEnv's server and ``corral serve``; print JSON.

    echo SCENARIO.json | python driver.py      (inside a peer virtualenv, see venvs.py)

Reads the path of a scenario per line of its input and prints a line of JSON per scenario,
until its input ends: the test module keeps one driver per OpenEnv release for all its
scenarios, so that OpenEnv's client and server are imported once per release, not once
per scenario (seconds of CPU each). The scenario names an app (``module:app`` or an
environment directory), the WebSocket frames, HTTP requests and OpenEnv client calls to
make; each is made against (a) the app under OpenEnv's own server (uvicorn, on a thread
of this process) and (b) ``corral serve`` of the same target (a process of its own, as
a user runs it), and every reply is recorded. The test compares the two records frame by
frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
OPENENV_LAUNCHER = """
import importlib, os, socket, sys
from pathlib import Path
import uvicorn
target, url_file = sys.argv[1], Path(sys.argv[2])
if ":" in target:
    module, _, attr = target.partition(":")
    app = getattr(importlib.import_module(module), attr)
else:
    sys.path[:0] = [target]
    app = importlib.import_module("server.app").app
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(64)
url_file.write_text(f"http://127.0.0.1:{sock.getsockname()[1]}")
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
"""


def normalize(value: Any) -> Any:
    """Replace run-dependent values (uuids, session ids) so two servers compare equal."""
    if isinstance(value, str):
        return _UUID.sub("<id>", value)
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    return value


@contextlib.contextmanager
def server(command: list[str], url_file: Path, cwd: str, env: dict[str, str] | None = None) -> Any:
    log = open(url_file.with_suffix(".log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True, env=env
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(url_file.with_suffix(".log").read_text()[-3000:])
            if url_file.exists() and url_file.read_text().strip():
                url = url_file.read_text().strip()
                healthy = False
                with contextlib.suppress(httpx.HTTPError):
                    healthy = httpx.get(f"{url}/health", timeout=2).status_code == 200
                if healthy:  # yielded outside the suppress: the caller's errors propagate
                    yield url
                    return
            time.sleep(0.05)
        raise RuntimeError("server did not start")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


async def ws_script(url: str, frames: list[Any], query: str = "") -> list[Any]:
    out: list[Any] = []
    async with connect(url.replace("http", "ws") + "/ws" + query, max_size=None) as ws:
        for frame in frames:
            await ws.send(frame if isinstance(frame, str) else json.dumps(frame))
            if isinstance(frame, dict) and frame.get("type") == "close":
                try:
                    extra = await asyncio.wait_for(ws.recv(), 10)
                    out.append({"unexpected": extra})
                except Exception:
                    out.append({"closed": ws.close_code})
                return out
            try:
                out.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            except Exception as exc:
                out.append({"closed": ws.close_code, "error": type(exc).__name__})
                return out
    return out


def http_script(url: str, requests: list[Any]) -> list[Any]:
    out = []
    # A connection per request: after a 500 OpenEnv's uvicorn closes the connection, and a
    # kept-alive one reused at that moment is reset (a race that failed a run under load).
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=url, timeout=30, limits=no_reuse) as http:
        for method, path, body in requests:
            if isinstance(body, str):
                response = http.request(
                    method, path, content=body, headers={"content-type": "application/json"}
                )
            else:
                response = http.request(method, path, json=body)
            try:
                payload: Any = response.json()
            except ValueError:
                payload = response.text
            out.append({"status": response.status_code, "body": payload})
    return out


def _result(result: Any) -> dict[str, Any]:
    return {
        "observation": result.observation
        if isinstance(result.observation, dict)
        else result.observation.model_dump(),
        "reward": result.reward,
        "done": result.done,
        "metadata": getattr(result, "metadata", None),
    }


async def client_script(url: str, calls: list[Any]) -> list[Any]:
    from openenv.core.generic_client import GenericEnvClient

    out: list[Any] = []
    async with GenericEnvClient(base_url=url) as env:
        for name, arg in calls:
            try:
                if name == "reset":
                    out.append(_result(await env.reset(**arg)))
                elif name == "step":
                    out.append(_result(await env.step(arg)))
                else:
                    out.append({"state": await env.state()})
            except Exception as exc:
                out.append({"raised": type(exc).__name__, "message": str(exc)})
    return out


async def mcp_script(url: str, calls: list[Any]) -> list[Any]:
    from openenv.core.mcp_client import MCPToolClient

    out: list[Any] = []
    client = MCPToolClient(base_url=url)
    try:
        for name, arg in calls:
            try:
                if name == "list":
                    out.append(sorted(t.name for t in await client.list_tools()))
                elif name == "call":
                    out.append(await client.call_tool(arg[0], **arg[1]))
                elif name == "reset":
                    result = await client.reset(**arg)
                    out.append(_result(result))
                elif name == "step":
                    out.append(_result(await client.step(arg)))
            except Exception as exc:
                out.append({"raised": type(exc).__name__, "message": str(exc)})
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return out


async def run_all(url: str, scenario: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for i, frames in enumerate(scenario.get("ws", [])):
        record[f"ws{i}"] = await ws_script(url, frames)
    record["http"] = await asyncio.to_thread(http_script, url, scenario.get("http", []))
    if scenario.get("client"):
        record["client"] = await client_script(url, scenario["client"])
    if scenario.get("mcp_client"):
        record["mcp_client"] = await mcp_script(url, scenario["mcp_client"])
    return normalize(record)


def openenv_app(target: str) -> Any:
    """The app of ``target`` as ``OPENENV_LAUNCHER`` loads it (``module:app``, or an
    environment directory holding ``server/app.py``)."""
    if ":" in target:
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)
    sys.path.insert(0, target)
    return importlib.import_module("server.app").app


def forget(directory: str) -> None:
    """Unload the modules imported from ``directory``: the next generated environment's
    ``server.app`` is another directory's (every generated package names it so)."""
    with contextlib.suppress(ValueError):
        sys.path.remove(directory)
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(directory + os.sep):
            del sys.modules[name]


@contextlib.contextmanager
def threaded_server(app: Any) -> Iterator[str]:
    """OpenEnv's own server (uvicorn, as ``OPENENV_LAUNCHER`` runs it) for ``app`` on a
    thread of this process, on a free port of 127.0.0.1; its URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            uv.run(sockets=[sock])
        except BaseException as exc:  # told to the waiting caller below
            failed.append(exc)

    thread = threading.Thread(target=serve, name="openenv-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while not uv.started:
            if failed or not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"OpenEnv's server did not start: {failed!r}")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(30)
        sock.close()


def play(scenario: dict[str, Any]) -> dict[str, Any]:
    """Both records of one scenario."""
    target, cwd = scenario["target"], scenario.get("cwd", os.getcwd())
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corral_file = Path(tmp) / "corral.url"
        corral_cmd = [
            sys.executable,
            "-m",
            "corral",
            "serve",
            target,
            "--port",
            "0",
            "--port-file",
            str(corral_file),
            *scenario.get("corral_args", []),
        ]
        try:
            with threaded_server(openenv_app(target)) as url:
                results["openenv"] = asyncio.run(run_all(url, scenario))
        finally:
            if ":" not in target:
                forget(target)
        with server(corral_cmd, corral_file, cwd) as url:
            results["corral"] = asyncio.run(run_all(url, scenario))
    return results


def main() -> None:
    # The records go to the real stdout, one line each; anything else printed (by an
    # environment, by OpenEnv) to stderr, so that it cannot break a line.
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        try:
            answer: dict[str, Any] = {"record": play(json.loads(Path(line.strip()).read_text()))}
        except Exception:
            answer = {"error": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
