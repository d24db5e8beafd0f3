"""Dockerfile rendering, the health check script, and build contexts."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import corral
from corral.envs.echo import EchoEnv
from corral.providers.dockerfile import (
    URL_FILE,
    BuildError,
    WheelTarget,
    corral_source,
    healthcheck_command,
    image_labels,
    prepare_context,
    render_dockerfile,
    serve_command,
)
from corral.providers.manifest import Manifest, load_manifest


def echo_manifest(tmp_path: Path, extra: str = "") -> Manifest:
    (tmp_path / "corral.yaml").write_text(
        "name: echo\nversion: 1.2.0\nentry_point: corral.envs.echo:EchoEnv\nport: 8100\n"
        "concurrency:\n  max_sessions: 4\n  idle_timeout_s: 30\n" + extra
    )
    return load_manifest(tmp_path)


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = dockerfile.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word, " ".join(rest.split())))
    return out


def test_render_dockerfile(tmp_path: Path) -> None:
    manifest = echo_manifest(tmp_path)
    labels = image_labels(manifest, "sha256:0123456789abcdef")
    text = render_dockerfile(manifest, labels=labels, base_image="corral-base:bookworm")
    steps = instructions(text)
    words = [w for w, _ in steps]
    assert words == [
        "FROM", "LABEL", "ENV", "RUN", "COPY", "COPY", "RUN",
        "FROM", "LABEL", "ENV", "RUN", "COPY", "COPY", "WORKDIR", "USER", "EXPOSE",
        "HEALTHCHECK", "CMD",
    ]  # fmt: skip
    assert steps[0] == ("FROM", "corral-base:bookworm AS install")
    assert steps[1] == ("LABEL", 'org.corral.stage="install"')
    assert steps[7] == ("FROM", "corral-base:bookworm")
    assert "--no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.lock" in steps[6][1]
    assert ("COPY", "--from=install /opt/venv /opt/venv") in steps
    assert ("USER", "corral") in steps and ("EXPOSE", "8100") in steps
    label_args = steps[8][1]
    for key, value in labels.items():
        assert f"{key}={json.dumps(value)}" in label_args
    health = dict(steps)["HEALTHCHECK"]
    assert health.startswith("--interval=10s --timeout=3s --start-period=10s --retries=3 CMD ")
    assert json.loads(health.split(" CMD ", 1)[1]) == healthcheck_command()
    cmd = json.loads(dict(steps)["CMD"])
    assert cmd == serve_command(manifest, "0.0.0.0", 8100)
    assert cmd[:9] == [
        "python", "-m", "corral", "serve", "corral.envs.echo:EchoEnv",
        "--host", "0.0.0.0", "--port", "8100",
    ]  # fmt: skip
    assert cmd[9:] == ["--port-file", URL_FILE, "--max-sessions", "4", "--idle-timeout", "30"]


def test_online_mode_and_default_base_image(tmp_path: Path) -> None:
    manifest = echo_manifest(tmp_path)
    text = render_dockerfile(manifest, labels={}, offline=False)
    assert "--no-index" not in text
    assert "pip install --find-links /tmp/wheels -r" in text
    assert text.count("FROM python:3.11-slim") == 2
    manifest = echo_manifest(tmp_path, "base_image: debian-python:12\n")
    assert "FROM debian-python:12 AS install" in render_dockerfile(manifest, labels={})


def test_labels(tmp_path: Path) -> None:
    manifest = echo_manifest(tmp_path, "resources:\n  cpu: 0.5\n  memory: 256Mi\n  pids: 64\n")
    labels = image_labels(manifest, "sha256:ab")
    assert labels == {
        "org.corral.name": "echo",
        "org.corral.version": "1.2.0",
        "org.corral.contract": "1.0.0",
        "org.corral.fingerprint": "sha256:ab",
        "org.corral.entry_point": "corral.envs.echo:EchoEnv",
        "org.corral.port": "8100",
        "org.corral.corral_version": corral.__version__,
        "org.corral.cpu": "0.5",
        "org.corral.memory": str(256 * 2**20),
        "org.corral.pids": "64",
    }


def test_target_platform_tags() -> None:
    args = WheelTarget(python_version="3.12", machine="aarch64").pip_args()
    assert args[:5] == ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.12"]
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms[0] == "manylinux_2_36_aarch64" and "manylinux_2_17_aarch64" in platforms
    assert "manylinux2014_aarch64" in platforms and all("aarch64" in p for p in platforms)
    assert "manylinux_2_37_aarch64" not in platforms
    abis = [args[i + 1] for i, a in enumerate(args) if a == "--abi"]
    assert abis == ["cp312", "abi3", "none"]


class _Ready(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/ready" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ready_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("status", "code"), [(200, 0), (503, 1)])
def test_healthcheck_script(
    tmp_path: Path, ready_server: ThreadingHTTPServer, status: int, code: int
) -> None:
    _Ready.status = status
    port = ready_server.server_address[1]
    url_file = tmp_path / "url"
    cmd = [sys.executable, *healthcheck_command()[1:]]
    # Without the URL file, the port comes from CORRAL_PORT.
    env = {"CORRAL_PORT": str(port), "CORRAL_URL_FILE": str(url_file)}
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == code
    # With it (host networking, port 0), the announced URL wins over CORRAL_PORT.
    url_file.write_text(f"http://127.0.0.1:{port}\n")
    env["CORRAL_PORT"] = "1"
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == code


def test_healthcheck_fails_when_nothing_listens(tmp_path: Path) -> None:
    cmd = [sys.executable, *healthcheck_command()[1:]]
    env = {"CORRAL_PORT": "1", "CORRAL_URL_FILE": str(tmp_path / "none")}
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 1


def test_corral_source_is_found() -> None:
    source = corral_source()
    assert source is not None and (source / "src" / "corral" / "__init__.py").is_file()


@pytest.mark.parametrize("where", ["same", "parent", "inside"])
def test_context_directory_must_not_swallow_the_environment(tmp_path: Path, where: str) -> None:
    env = tmp_path / "env"
    env.mkdir()
    echo_manifest(env)
    out = {"same": env, "parent": tmp_path, "inside": env / "ctx"}[where]
    with pytest.raises(BuildError, match=r"must not be the environment|copied into itself"):
        prepare_context(env, out)
    assert (env / "corral.yaml").is_file()


def test_a_failing_step_reports_its_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    echo_manifest(tmp_path)
    failing_pip = [sys.executable, "-c", "import sys; print('no wheel for thing'); sys.exit(2)"]
    lines: list[str] = []
    with pytest.raises(BuildError) as info:
        prepare_context(
            tmp_path, tmp_path / ".corral" / "build", pip=failing_pip, progress=lines.append
        )
    assert "building the wheel of corral failed (exit 2)" in str(info.value)
    assert "no wheel for thing" in str(info.value)
    assert "no wheel for thing" in lines


@pytest.mark.network
def test_prepare_context_for_a_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python project environment: its wheel, corral's wheel, pinned dependencies."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = tmp_path / "guess"
    (env / "guess_env").mkdir(parents=True)
    (env / "guess_env" / "__init__.py").write_text(
        "from corral.envs.echo import EchoEnv as GuessEnv\n"
    )
    (env / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "guess-env"\nversion = "0.3.0"\n'
        'dependencies = ["corral", "idna==3.7"]\n'
    )
    (env / "corral.yaml").write_text("name: guess\nentry_point: guess_env:GuessEnv\n")
    for junk in (".venv/lib/x.py", "__pycache__/a.pyc", ".git/HEAD", "notes/keep.txt"):
        (env / junk).parent.mkdir(parents=True, exist_ok=True)
        (env / junk).write_text("x")
    lines: list[str] = []
    ctx = prepare_context(env, env / ".corral" / "build", progress=lines.append, offline=True)
    wheels = sorted(p.name for p in (ctx.directory / "wheels").iterdir())
    assert any(w.startswith("guess_env-0.3.0-") for w in wheels)
    assert any(w.startswith(f"corral-{corral.__version__}-") for w in wheels)
    assert "idna-3.7-py3-none-any.whl" in wheels
    assert "idna==3.7" in ctx.requirements
    assert any(r.startswith("pydantic==") for r in ctx.requirements)
    # Local wheels are installed by path, so an unrelated "corral" on an index cannot win.
    assert [r for r in ctx.requirements if "corral" in r] == [
        f"/tmp/wheels/corral-{corral.__version__}-py3-none-any.whl"
    ]
    # Every pinned distribution has its wheel in the context (installable with --no-index).
    names = {w.split("-")[0].lower().replace("_", "-") for w in wheels}
    for line in ctx.requirements:
        if "==" in line:
            assert line.split("==")[0].lower().replace("_", "-") in names, line
    app = sorted(
        str(p.relative_to(ctx.directory / "app"))
        for p in (ctx.directory / "app").rglob("*")
        if p.is_file()
    )
    assert app == ["corral.yaml", "guess_env/__init__.py", "notes/keep.txt", "pyproject.toml"]
    assert ctx.labels["org.corral.fingerprint"] == EchoEnv.contract().fingerprint
    assert (ctx.directory / "requirements.lock").read_text().splitlines()[1:] == ctx.requirements
    assert any("resolving dependencies" in line for line in lines)
    assert "building the wheel of corral" in lines and "building the wheel of guess-env" in lines
    # Both wheels are cached by the hash of their sources, and the resolution by its inputs:
    # the next build asks pip for nothing until the download (made to fail, to stop early).
    failing_pip = [sys.executable, "-c", "import sys; print('stop'); sys.exit(2)"]
    again: list[str] = []
    with pytest.raises(BuildError, match="downloading wheels failed"):
        prepare_context(env, env / ".corral" / "build", pip=failing_pip, progress=again.append)
    reused = [line for line in again if line.startswith("reusing ")]
    assert [line.split()[3].split("-")[0] for line in reused[:2]] == ["corral", "guess_env"]
    assert reused[2].startswith(f"reusing the resolution of {len(ctx.requirements)} ")
    # A changed source is built again.
    (env / "guess_env" / "extra.py").write_text("X = 1\n")
    with pytest.raises(BuildError, match="building the wheel of guess-env failed"):
        prepare_context(env, env / ".corral" / "build", pip=failing_pip)
