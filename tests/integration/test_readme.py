"""Every code block of README.md and docs/*.md runs as written.

Each ``python`` block is a complete program: it is saved as ``snippet.py`` in a fresh
directory (so that its imports must work from anywhere, not only from this repository)
and run by this interpreter, which must exit 0. Shell blocks run in ``bash``. What a
block needs is said in an HTML comment right above it, invisible on the rendered page::

    <!-- snippet: server=corral.envs.echo:EchoEnv -->

(indented as much as the block is, in a list item). Keys (space-separated; a value runs
to the next key):

* ``server=TARGET``: ``corral serve TARGET`` runs on a free port, and the block's
  ``http://127.0.0.1:8000`` (where the page says the server is) is replaced by its URL.
  ``TARGET`` may be ``.``: the scaffolded environment's directory, or a directory of the
  repository (``examples/tictactoe``), as a user runs it from a clone.
* ``openenv-server``: a real openenv-core server (``tests/support/openenv_peer_app.py``)
  replaces ``http://127.0.0.1:8001``.
* ``cwd=scaffold``: run where ``corral init demo_env`` was run; ``cwd=demo_env``: in the
  scaffolded environment's directory.
* ``image``: the Docker image ``corral build`` makes of the scaffold exists (built once).
* ``serves``: a shell block of ``corral serve TARGET ... --port 8000`` lines: each runs on a
  free port until ``/ready`` answers, then is stopped (``TARGET`` as for ``server=``).
* ``docker`` / ``network`` / ``slow``: the test is marked so (Docker engine, package index).
* ``skip=REASON``: not run here; the reason names where it is exercised instead.
* ``timeout=SECONDS``: the block's time limit (default 120).

A block without a comment must run bare. A new block that needs something the runner
cannot give fails here until it is annotated, with a reason when it is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.docker_fixtures import DEMO_IMAGE_GROUP, untag
from tests.support.peers import corral_server, openenv_server
from tests.support.servers import running

from corral.client import AsyncEnvClient

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
SERVER_URL = "http://127.0.0.1:8000"
OPENENV_URL = "http://127.0.0.1:8001"

_BLOCK = re.compile(
    r"(?:<!-- snippet: (?P<notes>[^\n]*?) -->\n[ ]*)?```(?P<lang>[a-z]*)\n(?P<code>.*?)```", re.S
)
_SHELL = ("sh", "bash", "console", "shell")
_KEYS = ("server", "openenv-server", "cwd", "image", "serves", "docker", "network", "slow")
_KEYS += ("skip", "timeout")


@dataclass
class Snippet:
    """One code block of a page and what it needs."""

    page: Path
    line: int
    lang: str
    code: str
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_notes(text: str) -> dict[str, str]:
    """``key=value key2 skip=a reason`` → a dict (a bare key maps to ''; ``skip`` takes the
    rest of the text as its reason)."""
    notes: dict[str, str] = {}
    words = text.split()
    for i, word in enumerate(words):
        key, _, value = word.partition("=")
        if key not in _KEYS:
            raise ValueError(f"unknown snippet note {word!r}; known: {', '.join(_KEYS)}")
        if key == "skip":
            notes[key] = " ".join([value, *words[i + 1 :]]).strip()
            break
        notes[key] = value
    return notes


def snippets() -> list[Snippet]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            lang = match.group("lang")
            if lang != "python" and lang not in _SHELL:
                continue  # YAML, tables of output, plain text: nothing to run
            line = text[: match.start("code")].count("\n")
            notes = parse_notes(match.group("notes") or "")
            found.append(Snippet(page, line, lang, match.group("code"), notes))
    return found


def needs_scaffold(snippet: Snippet) -> bool:
    return "cwd" in snippet.notes or snippet.notes.get("server") == "."


# Under ``--dist loadgroup`` the blocks run on two workers: the pages with a block that
# uses the scaffold (the README and the pages that continue its example) in one group,
# the other pages in the other, so a page's blocks run in order on one worker and each
# group starts only the scaffold and servers its own pages need. A worker running both
# groups shares the module's fixtures between them; two workers each have their own.
SCAFFOLD_PAGES_GROUP = "readme:scaffold-pages"
OTHER_PAGES_GROUP = "readme:other-pages"


def _params() -> list[Any]:
    params = []
    found = snippets()
    scaffold_pages = {snippet.page for snippet in found if needs_scaffold(snippet)}
    for snippet in found:
        marks: list[Any] = [getattr(pytest.mark, m) for m in ("docker", "network", "slow")]
        marks = [
            mark
            for mark, key in zip(marks, ("docker", "network", "slow"), strict=True)
            if key in snippet.notes
        ]
        if "image" in snippet.notes:
            marks += [pytest.mark.docker, pytest.mark.network]
            marks.append(pytest.mark.xdist_group(DEMO_IMAGE_GROUP))
        elif snippet.page in scaffold_pages:
            marks.append(pytest.mark.xdist_group(SCAFFOLD_PAGES_GROUP))
        else:
            marks.append(pytest.mark.xdist_group(OTHER_PAGES_GROUP))
        if "skip" in snippet.notes:
            marks.append(pytest.mark.skip(reason=snippet.notes["skip"]))
        params.append(pytest.param(snippet, id=snippet.id, marks=marks))
    return params


def environment() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "200",
        "PYTHONPATH": "",
    }


def run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory where ``corral init demo_env`` ran (the pages' running example)."""
    where = tmp_path_factory.mktemp("scaffold")
    done = run([str(BIN / "corral"), "init", "demo_env"], where, 120)
    assert done.returncode == 0, done.stdout + done.stderr
    return where


class Servers:
    """Starts each server a block asks for once, and stops them all at the end."""

    def __init__(self, stack: ExitStack, home: Path) -> None:
        self.stack = stack
        self.home = home
        """Where the servers whose blocks need no directory of theirs run: keyed by it, not
        by each test's ``tmp_path``, the blocks that name one target share its server."""
        self.urls: dict[tuple[str, str], str] = {}

    def corral(self, target: str, cwd: Path) -> str:
        key = (target, str(cwd))
        if key not in self.urls:
            self.urls[key] = self.stack.enter_context(corral_server(target, cwd=cwd))
        return self.urls[key]

    def openenv(self) -> str:
        if ("openenv", "") not in self.urls:
            self.urls[("openenv", "")] = self.stack.enter_context(openenv_server())
        return self.urls[("openenv", "")]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with ExitStack() as stack:
        yield Servers(stack, tmp_path_factory.mktemp("servers"))


@pytest.fixture(scope="module")
def scaffold_image(scaffold: Path, docker_client: Any, base_image: str) -> Iterator[str]:
    """``corral build`` of the scaffold (the image its DockerProvider block starts)."""
    from corral.providers.docker import build_image

    tag = build_image(scaffold / "demo_env", base_image=base_image).tag
    yield tag
    untag(docker_client, tag)


@pytest.mark.parametrize("snippet", _params())
def test_snippet_runs_as_written(
    snippet: Snippet, shared: Servers, tmp_path: Path, request: Any
) -> None:
    notes = snippet.notes
    if "docker" in notes:
        request.getfixturevalue("base_image")  # skips (or fails in CI) without an engine
    if "image" in notes:
        request.getfixturevalue("scaffold_image")
    cwd = server_cwd = tmp_path
    if needs_scaffold(snippet):
        # Asked for here, not in the signature: the other pages' worker never runs corral init.
        scaffold: Path = request.getfixturevalue("scaffold")
        places = {"scaffold": scaffold, "demo_env": scaffold / "demo_env", "": tmp_path}
        cwd = places[notes.get("cwd", "")]
        server_cwd = scaffold / "demo_env" if notes.get("server") == "." else cwd
    if server_cwd == tmp_path:  # needs no directory of its own: one server per target
        server_cwd = shared.home
    code = snippet.code
    if "server" in notes:
        target = notes["server"]
        if target != "." and (ROOT / target).is_dir():  # a directory of the repository
            target = str(ROOT / target)
        url = shared.corral(target, server_cwd)
        assert SERVER_URL in code, f"{snippet.id}: server= given but {SERVER_URL} not used"
        code = code.replace(SERVER_URL, url)
    if "openenv-server" in notes:
        assert OPENENV_URL in code, f"{snippet.id}: openenv-server given but no {OPENENV_URL}"
        code = code.replace(OPENENV_URL, shared.openenv())
    timeout = float(notes.get("timeout") or 120)
    if snippet.lang == "python":
        script = cwd / "snippet.py"  # its directory is on sys.path, as for a user's script
        script.write_text(code, encoding="utf-8")
        try:
            done = run([sys.executable, str(script)], cwd, timeout)
        finally:
            if cwd != tmp_path:
                script.unlink()
    elif "serves" in notes:
        for line in [line for line in code.splitlines() if line.strip()]:
            serve_briefly(line.split("#")[0].strip(), cwd, tmp_path)
        return
    else:
        lines = [line.removeprefix("$ ") for line in code.splitlines()]
        done = run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd, timeout)
    assert done.returncode == 0, (
        f"{snippet.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def serve_briefly(command: str, cwd: Path, tmp_path: Path) -> None:
    """Run one ``corral serve ... --port 8000`` line on a free port until /ready answers."""
    argv = shlex.split(command)
    assert argv[:2] == ["corral", "serve"] and "--port" in argv, command
    port_file = tmp_path / "url"
    port_file.unlink(missing_ok=True)
    argv[argv.index("--port") + 1] = "0"
    argv[0] = str(BIN / "corral")
    target = argv[2]
    if not (cwd / target).exists() and (ROOT / target).is_dir():  # a directory of the repository
        argv[2] = str(ROOT / target)
    server = subprocess.Popen(
        [*argv, "--port-file", str(port_file)],
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = False
        for _ in range(1200):  # bounded: about 120 s of 0.1 s waits
            if server.poll() is not None:
                break
            if port_file.exists():
                try:
                    ready = httpx.get(f"{port_file.read_text()}/ready", timeout=1).is_success
                except httpx.HTTPError:
                    ready = False
                if ready:
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(0.1)
        output = "" if ready else (server.stdout.read() if server.poll() is not None else "")
        assert ready, f"{command!r} did not become ready:\n{output[-3000:]}"
    finally:
        server.terminate()
        server.wait(30)


def test_every_block_is_runnable_or_says_why_not() -> None:
    found = snippets()
    assert len(found) > 20
    for snippet in found:
        if "skip" in snippet.notes:
            assert snippet.notes["skip"], f"{snippet.id}: skip needs a reason"
        if snippet.lang == "python":
            assert "await " not in snippet.code or "asyncio.run(" in snippet.code, (
                f"{snippet.id}: top-level await does not run as a script; wrap it in "
                "async def main() and asyncio.run(main())"
            )


def test_unknown_notes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown snippet note 'sever=y'"):
        parse_notes("server=x sever=y")
    assert parse_notes("server=corral.envs.echo:EchoEnv docker") == {
        "server": "corral.envs.echo:EchoEnv",
        "docker": "",
    }
    assert parse_notes("network skip=needs a model, docker and a dataset") == {
        "network": "",
        "skip": "needs a model, docker and a dataset",
    }


def readme_module() -> types.ModuleType:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    module = types.ModuleType("readme_example")
    exec(compile(blocks[0], "README.md", "exec"), module.__dict__)
    return module


async def test_readme_environment_plays_an_episode() -> None:
    example = readme_module()
    with running(example.HighLow) as srv:
        async with AsyncEnvClient(srv.url, env=example.HighLow) as env:
            await env.reset(seed=3)
            low, high, result = 0, 100, None
            for _ in range(10):
                guess = (low + high) // 2
                result = await env.step(example.Guess(number=guess))
                if result.done:
                    break
                if result.observation.hint == "higher":
                    low = guess + 1
                else:
                    high = guess - 1
            assert result is not None and result.terminated and result.reward == 1.0
