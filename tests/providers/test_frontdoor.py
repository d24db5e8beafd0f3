"""Front doors: the rendered nginx and HAProxy configurations, checked and run for real."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from tests.support.frontdoor import FrontDoor, Kind, fleet_behind, require

from corral.client import AsyncEnvClient
from corral.envs.echo import EchoAction
from corral.providers.frontdoor import (
    ROUTE_HEADER,
    Backend,
    FrontDoorError,
    render_haproxy,
    render_nginx,
)

pytestmark = pytest.mark.xdist_group("frontdoor")

KINDS: list[Kind] = ["nginx", "haproxy"]


@pytest.mark.parametrize(
    "bad",
    [
        ("s 1", "127.0.0.1:80"),
        ("s1;", "127.0.0.1:80"),
        ("-s1", "127.0.0.1:80"),
        ("s" * 64, "127.0.0.1:80"),
        ("s1", "127.0.0.1"),
        ("s1", "127.0.0.1:0"),
        ("s1", "127.0.0.1:70000"),
        ("s1", "host;evil:80"),
        ("s1", "a b:80"),
    ],
)
def test_a_name_or_address_cannot_smuggle_a_directive(bad: tuple[str, str]) -> None:
    with pytest.raises(FrontDoorError):
        Backend(*bad)


def test_backends_are_checked_as_a_set() -> None:
    with pytest.raises(FrontDoorError, match="at least one"):
        render_nginx([])
    twice = [Backend("s1", "127.0.0.1:81"), Backend("s1", "127.0.0.1:82")]
    with pytest.raises(FrontDoorError, match="repeated: s1"):
        render_haproxy(twice)
    with pytest.raises(FrontDoorError, match="listen"):
        render_nginx([Backend("s1", "127.0.0.1:81")], listen="0.0.0.0")
    assert Backend.parse(" s1 = 10.0.0.1:8000 ") == Backend("s1", "10.0.0.1:8000")
    with pytest.raises(FrontDoorError, match="ID=HOST:PORT"):
        Backend.parse("10.0.0.1:8000")


@pytest.mark.parametrize("kind", KINDS)
def test_the_rendered_configuration_passes_the_proxys_own_check(kind: Kind, tmp_path: Path) -> None:
    binary = require(kind)
    backends = [Backend("s0", "127.0.0.1:18001"), Backend("pod-1.a_b", "[::1]:18002")]
    conf = tmp_path / "door.conf"
    if kind == "nginx":
        conf.write_text(render_nginx(backends, listen="127.0.0.1:18080", prefix=tmp_path))
        check = [binary, "-t", "-p", str(tmp_path), "-c", str(conf)]
    else:
        conf.write_text(render_haproxy(backends, stats_socket=tmp_path / "admin.sock"))
        check = [binary, "-c", "-f", str(conf)]
    result = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_nginx_snippet_goes_inside_http(tmp_path: Path) -> None:
    binary = require("nginx")
    snippet = render_nginx([Backend("s0", "127.0.0.1:18001")], standalone=False)
    assert "events" not in snippet and "daemon" not in snippet
    whole = (
        f"daemon off; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\n"
        f"events {{}}\nhttp {{\n{snippet}}}\n"
    )
    conf = tmp_path / "nginx.conf"
    conf.write_text(whole)
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        whole = whole.replace("http {\n", f"http {{\n{kind}_temp_path {tmp_path}/{kind};\n", 1)
    conf.write_text(whole)
    result = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def _server_of(door: FrontDoor, header: str | None) -> str:
    headers = {ROUTE_HEADER: header} if header else {}
    reply = httpx.get(f"{door.url}/ready", headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["server_id"])


@pytest.mark.parametrize("kind", KINDS)
async def test_the_header_routes_and_its_absence_balances(kind: Kind, tmp_path: Path) -> None:
    with fleet_behind(kind, "corral.envs.echo:EchoEnv", 2, tmp_path) as (servers, door):
        for server in servers.servers:
            assert {_server_of(door, server.id) for _ in range(6)} == {server.id}
        assert {_server_of(door, None) for _ in range(8)} == {"s0", "s1"}
        # A WebSocket through the door reaches the server it names, and works.
        for server in servers.servers:
            async with AsyncEnvClient(
                door.url, headers={ROUTE_HEADER: server.id}, connect_timeout=30
            ) as env:
                assert env.server_info["server"]["id"] == server.id
                await env.reset(seed=1)
                result = await env.step(EchoAction(message="through the door"))
                assert result.observation.echoed_message == "through the door"


def test_deploy_prints_a_configuration_the_proxy_accepts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli.main import app

    runner = CliRunner()
    out = tmp_path / "haproxy.cfg"
    result = runner.invoke(
        app,
        ["deploy", "haproxy", "--server", "s0=127.0.0.1:18001", "--server", "s1=127.0.0.1:18002",
         "--listen", "127.0.0.1:18080", "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "use-server s1 if" in out.read_text()
    result = subprocess.run(
        [require("haproxy"), "-c", "-f", str(out)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    printed = runner.invoke(app, ["deploy", "nginx", "--server", "s0=127.0.0.1:18001"])
    assert printed.exit_code == 0 and "corral_server_s0" in printed.stdout
    refused = runner.invoke(app, ["deploy", "nginx", "--server", "s0;=1.2.3.4:5"])
    assert refused.exit_code == 2 and "must match" in refused.output
    empty = runner.invoke(app, ["deploy", "nginx"])
    assert empty.exit_code == 2 and "--server" in empty.output
