"""One rule for every command's TARGET (``corral.cli.target``): the forms, from any
directory, for corral environments and OpenEnv ones laid out as OpenEnv's ``envs/`` are.

The OpenEnv environment packages here are written by this file in OpenEnv's layout (an
``__init__.py`` at the top, ``models.py``, ``server/app.py`` importing ``from ..models``),
with ``openenv-core`` 0.3 from the test virtualenv.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from corral.cli.target import TargetKind, read_target
from corral.server import create_app
from corral.server.target import TargetError

pytestmark = pytest.mark.xdist_group("openenv")  # the tests importing openenv share a worker

CORRAL = Path(sys.executable).with_name("corral")
"""The console script itself: unlike ``python -m``, it puts no directory on the path."""

MY_ENV = """
from corral.envs.wordle import WordleEnv


class MyEnv(WordleEnv):
    name = "mine"
"""

MODELS = """
from openenv.core.env_server.types import Action, Observation


class NoteAction(Action):
    text: str


class NoteObservation(Observation):
    count: int = 0
    last: str = ""
"""

ENVIRONMENT = '''
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

try:
    from ..models import NoteObservation
except ImportError:
    from models import NoteObservation


class NotesEnvironment(Environment):
    """Annotated with OpenEnv's base classes only, as coding_env's is."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return NoteObservation(count=0)

    def step(self, action: Action, timeout_s=None, **kwargs) -> Observation:
        self._state.step_count += 1
        text = self.prefix + action.text
        return NoteObservation(count=self._state.step_count, last=text, reward=1.0)

    @property
    def state(self) -> State:
        return self._state
'''

APP = """
from openenv.core.env_server.http_server import create_app

from ..models import NoteAction, NoteObservation
from .notes_environment import NotesEnvironment


def make():
    return NotesEnvironment(prefix="> ")


app = create_app(make, NoteAction, NoteObservation, env_name="notes_env")
"""


def write_package(root: Path, name: str, manifest: str | None) -> Path:
    """An OpenEnv environment package ``name`` under ``root``, OpenEnv's layout."""
    pkg = root / name
    (pkg / "server").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(MODELS)
    (pkg / "server" / "__init__.py").write_text("")
    (pkg / "server" / "notes_environment.py").write_text(ENVIRONMENT)
    (pkg / "server" / "app.py").write_text(APP)
    if manifest is not None:
        (pkg / "openenv.yaml").write_text(textwrap.dedent(manifest))
    return pkg


def episode(env: object) -> list[dict[str, object]]:
    """A reset and a step of ``env`` over OpenEnv's HTTP session routes."""
    with TestClient(create_app(env)) as http:
        sid = http.post("/sessions").json()["session_id"]
        headers = {"X-Corral-Session": sid}
        first = http.post("/reset", json={}, headers=headers).json()
        second = http.post("/step", json={"action": {"text": "hi"}}, headers=headers).json()
        return [first, second]


def test_every_form_is_read_by_one_rule(tmp_path: Path, echo_env: Path) -> None:
    assert read_target("gym:CartPole-v1").kind is TargetKind.GYM
    assert read_target(str(echo_env)).kind is TargetKind.DIRECTORY
    assert read_target("corral.envs.echo:EchoEnv").kind is TargetKind.REFERENCE
    url = read_target("http://127.0.0.1:1,http://127.0.0.1:2", urls=True)
    assert url.kind is TargetKind.URL and url.urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    with pytest.raises(TargetError, match="running server"):
        read_target("http://127.0.0.1:1")
    with pytest.raises(TargetError, match="not a directory, a file or an entry point"):
        read_target(str(tmp_path / "nowhere"))
    write_package(tmp_path, "installed_notes", None)
    package = read_target("installed_notes", cwd=tmp_path)
    assert package.kind is TargetKind.PACKAGE
    assert package.reference == "installed_notes.server.app:app"


def test_an_openenv_directory_is_imported_as_a_package(tmp_path: Path) -> None:
    """33.1: the app imports ``from ..models``; it loads as OpenEnv runs it."""
    pkg = write_package(
        tmp_path, "dir_notes", "spec_version: 1\nname: dir_notes\napp: server.app:app\n"
    )
    chosen = read_target(str(pkg))
    assert chosen.kind is TargetKind.DIRECTORY and chosen.root == pkg.resolve()
    served = chosen.load()
    first, second = episode(served)
    assert first["observation"] == {"count": 0, "last": ""}
    assert second["observation"] == {"count": 1, "last": "> hi"} and second["reward"] == 1.0


def test_an_openenv_yaml_without_app_defaults_to_server_app(tmp_path: Path) -> None:
    """33.2: the older manifest format (no ``app:``) is OpenEnv's default app."""
    old_format = """\
        name: old_notes
        version: "0.1.0"
        description: Notes, in the older manifest format.
        action: NoteAction
        observation: NoteObservation
    """
    pkg = write_package(tmp_path, "old_notes", old_format)
    chosen = read_target(str(pkg))
    assert chosen.reference == "server.app:app"
    assert episode(chosen.load())[1]["observation"] == {"count": 1, "last": "> hi"}


def test_the_class_form_serves_what_the_app_serves(tmp_path: Path) -> None:
    """33.3: a class annotated with OpenEnv's base Action/Observation, built only by its
    app's factory: served with the app's models and factory, or refused by name."""
    write_package(tmp_path, "class_notes", None)
    chosen = read_target("class_notes.server.notes_environment:NotesEnvironment", cwd=tmp_path)
    served = chosen.load()
    assert served.action_type.__name__ == "NoteAction"
    with TestClient(create_app(served)) as http:
        schema = http.get("/schema").json()
        assert set(schema["action"]["properties"]) >= {"text"}
        refused = http.post("/step", json={"action": {"nope": 1}})
        assert refused.status_code == 422
    assert episode(served)[1]["observation"] == {"count": 1, "last": "> hi"}


def test_a_class_without_its_app_is_refused_naming_the_forms_that_work(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, "bare_notes", None)
    (pkg / "server" / "app.py").unlink()
    (pkg / "models.py").write_text(MODELS + "\n\nclass OtherAction(NoteAction):\n    pass\n")
    chosen = read_target("bare_notes.server.notes_environment:NotesEnvironment", cwd=tmp_path)
    with pytest.raises(TargetError) as caught:
        chosen.load()
    message = str(caught.value)
    assert "'bare_notes.server.app:app' or the environment's directory" in message
    assert "OpenEnv's base Action" in message


def _run_corral(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # Only the without-gradio shim and nothing of the repository: the console script
    # must find the environment from its working directory alone.
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "support" / "without_gradio")
    env["COLUMNS"] = "200"  # rich wraps errors at the terminal's width
    return subprocess.run(
        [str(CORRAL), *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


def test_corral_eval_finds_the_environment_from_its_directory(tmp_path: Path) -> None:
    """31.6: ``corral eval pkg.env:MyEnv --policy scripted`` and ``corral eval .`` from the
    environment's directory, with the console script (no directory on its path)."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "env.py").write_text(MY_ENV)
    (tmp_path / "corral.yaml").write_text("name: mine\nentry_point: mypkg.env:MyEnv\n")
    common = ["--episodes", "2", "--concurrency", "2", "--max-steps", "6", "--no-progress"]
    by_reference = _run_corral(
        "eval", "mypkg.env:MyEnv", "--policy", "scripted", "--out", "runs/a", *common, cwd=tmp_path
    )
    assert by_reference.returncode == 0, by_reference.stderr[-2000:]
    assert "episodes, settings and summary in runs/a" in by_reference.stdout
    by_directory = _run_corral(
        "eval", ".", "--policy", "scripted", "--out", "runs/b", *common, cwd=tmp_path
    )
    assert by_directory.returncode == 0, by_directory.stderr[-2000:]
    assert (tmp_path / "runs" / "b" / "episodes.jsonl").is_file()
    nowhere = _run_corral("eval", "nowhere", cwd=tmp_path)
    assert nowhere.returncode == 2
    assert "Traceback" not in nowhere.stderr
    assert "not a directory, a file or an entry point" in nowhere.stderr


CUSTOM_APP = """
from fastapi.responses import HTMLResponse

from ..models import NoteAction, NoteObservation
from .app import app


@app.get("/web", response_class=HTMLResponse)
async def notes_page():
    return "<h1>notes</h1>"


@app.get("/config")
def config():
    return {"prefix": "> "}
"""


def test_the_app_form_keeps_the_apps_own_routes(tmp_path: Path) -> None:
    """33.7: routes an environment's app adds itself (a custom /web page, a /config) are
    served by corral too; OpenEnv's own routes are corral's."""
    pkg = write_package(tmp_path, "web_notes", None)
    (pkg / "server" / "custom.py").write_text(CUSTOM_APP)
    served = read_target("web_notes.server.custom:app", cwd=tmp_path).load()
    with TestClient(create_app(served)) as http:
        page = http.get("/web")
        assert page.status_code == 200 and page.text == "<h1>notes</h1>"
        assert http.get("/config").json() == {"prefix": "> "}
        assert http.get("/health").json() == {"status": "healthy"}
        # OpenEnv's routes are corral's, with OpenEnv's semantics.
        assert http.post("/reset", json={}).json()["observation"] == {"count": 0, "last": ""}


def test_enable_web_interface_turns_the_web_ui_on() -> None:
    """33.7: OpenEnv's ENABLE_WEB_INTERFACE=true is corral's --web."""
    import httpx
    from tests.support.peers import corral_server

    with corral_server("corral.envs.echo:EchoEnv", env={"ENABLE_WEB_INTERFACE": "true"}) as url:
        page = httpx.get(f"{url}/web/", timeout=30, follow_redirects=True)
    assert page.status_code == 200 and "<html" in page.text.lower()
