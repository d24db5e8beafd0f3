"""The Pod router of ``corral deploy k8s --router``, run for real: Debian's nginx on
127.0.0.1 with the rendered configuration, and two ``corral serve`` processes standing
for two Pods, each on a loopback address of its own (as Pods have IPs of their own) and
the same port, each with its address as ``--server-id`` (issue 29)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.support.frontdoor import free_port, require, wait_until

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction
from corral.providers.frontdoor import (
    ROUTE_HEADER,
    FrontDoorError,
    render_nginx_pod_router,
)

pytestmark = pytest.mark.xdist_group("frontdoor")

PODS = ("127.0.0.2", "127.0.0.3")


def ready(url: str, headers: dict[str, str] | None = None) -> str | None:
    try:
        reply = httpx.get(f"{url}/ready", headers=headers, timeout=5, trust_env=False)
        return str(reply.json().get("server_id"))
    except (httpx.HTTPError, ValueError):
        return None


@pytest.fixture
def router(tmp_path: Path) -> Iterator[str]:
    nginx = require("nginx")
    port = free_port()
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral",
                "serve",
                "corral.envs.echo:EchoEnv",
                "--host",
                ip,
                "--port",
                str(port),
                "--server-id",
                ip,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for ip in PODS
    ]
    listen = free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        render_nginx_pod_router(
            f"{PODS[0]}:{port}", pod_port=port, listen=f"127.0.0.1:{listen}", prefix=tmp_path
        )
    )
    proxy = subprocess.Popen(
        [nginx, "-p", str(tmp_path), "-c", str(conf)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{listen}"
    try:
        for ip in PODS:
            wait_until(lambda ip=ip: ready(f"http://{ip}:{port}") == ip, f"the server on {ip}")
        wait_until(lambda: ready(url) is not None, "nginx")
        yield url
    finally:
        for process in (proxy, *servers):
            process.terminate()
            process.wait(60)


def test_the_header_reaches_the_pod_it_names(router: str) -> None:
    for ip in PODS:
        for _ in range(3):
            assert ready(router, {ROUTE_HEADER: ip}) == ip
    # No header, or anything that is not an IPv4 address: the fleet's Service.
    for value in (None, "corral-echo-0", "127.0.0.3:22", "999.0.0.1", "1.2.3.4.5", "::1"):
        headers = None if value is None else {ROUTE_HEADER: value}
        assert ready(router, headers) == PODS[0], value


async def test_a_websocket_session_through_the_router(router: str) -> None:
    async with AsyncEnvClient(router) as env:
        await env.reset()
        result = await env.step(EchoAction(message="via router"))
        assert result.observation.echoed_message == "via router"


def test_the_configuration_is_checked(tmp_path: Path) -> None:
    nginx = require("nginx")
    text = render_nginx_pod_router("corral-echo.rl.svc:80", pod_port=8000, prefix=tmp_path)
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    check = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True
    )
    # nginx -t resolves the fleet's name: outside a cluster only that may fail.
    assert check.returncode == 0 or "host not found" in check.stderr, check.stderr
    for bad in ("fleet;evil:80", "fleet", "a b:80"):
        with pytest.raises(FrontDoorError):
            render_nginx_pod_router(bad, pod_port=8000)
    with pytest.raises(FrontDoorError):
        render_nginx_pod_router("fleet:80", pod_port=0)
