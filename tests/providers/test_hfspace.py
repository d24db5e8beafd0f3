"""Hugging Face Space staging, and uploads by huggingface_hub's real client to a fake Hub.

The fake Hub is an HTTP server on 127.0.0.1 that answers the routes the client uses to
create a repo and commit a folder, validates README front matter as the Hub does for
Spaces, and records every request so that the tests can check what the client sent.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

import corral
from corral.envs.echo import EchoEnv
from corral.providers.hfspace import (
    SPACE_COLORS,
    SpaceError,
    StagedSpace,
    check_repo_id,
    contract_markdown,
    push_space,
    stage_space,
)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def ndjson(self) -> list[Any]:
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


def space_front_matter_errors(readme: str) -> list[str]:
    """What the Hub checks in a Docker Space's README metadata."""
    if not readme.startswith("---\n"):
        return ["README.md has no YAML front matter"]
    meta = yaml.safe_load(readme.split("---\n", 2)[1])
    errors = []
    if meta.get("sdk") not in ("gradio", "streamlit", "docker", "static"):
        errors.append(f'"sdk" must be one of gradio, streamlit, docker, static: {meta.get("sdk")}')
    if "app_port" in meta and not isinstance(meta["app_port"], int):
        errors.append('"app_port" must be a number')
    for key in ("colorFrom", "colorTo"):
        if key in meta and meta[key] not in SPACE_COLORS:
            errors.append(f'"{key}" must be one of {SPACE_COLORS}')
    if not isinstance(meta.get("title", ""), str) or not isinstance(meta.get("tags", []), list):
        errors.append('"title" must be a string and "tags" a list')
    return errors


@dataclass
class FakeHub:
    url: str
    requests: list[Recorded] = field(default_factory=list)
    existing: set[str] = field(default_factory=set)

    def of(self, suffix: str) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith(suffix) or suffix in r.path]


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            hub.requests.append(
                Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            status, reply = self.route(body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def route(self, body: bytes) -> tuple[int, Any]:
            if self.headers.get("Authorization") != "Bearer hf_test_token":
                return 401, {"error": "Invalid credentials in Authorization header"}
            if self.path == "/api/repos/create":
                payload = json.loads(body)
                repo = f"{payload['organization']}/{payload['name']}"
                if repo in hub.existing:
                    return 409, {
                        "error": "You already created this space repo",
                        "url": f"{hub.url}/spaces/{repo}",
                    }
                hub.existing.add(repo)
                return 200, {"url": f"{hub.url}/spaces/{repo}"}
            if self.path == "/api/validate-yaml":
                errors = space_front_matter_errors(json.loads(body)["content"])
                if errors:
                    return 400, {"errors": [{"message": e} for e in errors]}
                return 200, {}
            if self.path.startswith("/api/spaces/") and "/preupload/" in self.path:
                files = json.loads(body)["files"]
                return 200, {
                    "files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in files
                    ]
                }
            if self.path.startswith("/api/spaces/") and "/commit/" in self.path:
                repo = self.path.split("/api/spaces/", 1)[1].split("/commit/", 1)[0]
                return 200, {
                    "commitUrl": f"{hub.url}/spaces/{repo}/commit/c0ffee",
                    "commitOid": "c0ffee" * 6 + "c0ff",
                    "pullRequestUrl": None,
                }
            return 404, {"error": f"no route {self.path}"}

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield hub
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> StagedSpace:
    env = tmp_path_factory.mktemp("echo-space")
    (env / "corral.yaml").write_text(
        "name: echo\nversion: 0.4.0\nentry_point: corral.envs.echo:EchoEnv\nport: 7860\n"
        "description: Echoes messages back.\n"
    )
    (env / "notes.txt").write_text("kept\n")
    (env / "__pycache__").mkdir()
    (env / "__pycache__" / "x.pyc").write_bytes(b"junk")
    return stage_space(
        env,
        tmp_path_factory.mktemp("out") / "space",
        "my-org/echo-env",
        emoji="🔁",
        color_from="purple",
        color_to="gray",
        tags=["text", "corral"],
    )


@pytest.mark.network
def test_staged_folder_exactly(staged: StagedSpace) -> None:
    assert staged.files == [
        "Dockerfile",
        "README.md",
        "app/corral.yaml",
        "app/notes.txt",
        "requirements.lock",
        f"wheels/corral-{corral.__version__}-py3-none-any.whl",
    ]
    dockerfile = (staged.directory / "Dockerfile").read_text()
    # The Space's builder has network and pulls public images; the install is pinned.
    assert "FROM python:3.11-slim AS install" in dockerfile and "--no-index" not in dockerfile
    assert "EXPOSE 7860" in dockerfile and '"--port", "7860"' in dockerfile
    pins = (staged.directory / "requirements.lock").read_text().splitlines()[1:]
    assert all("==" in p or p.startswith("/tmp/wheels/") for p in pins)


@pytest.mark.network
def test_readme_front_matter(staged: StagedSpace) -> None:
    readme = (staged.directory / "README.md").read_text()
    assert readme.startswith("---\n")
    meta = yaml.safe_load(readme.split("---\n", 2)[1])
    assert meta == {
        "title": "echo",
        "emoji": "🔁",
        "colorFrom": "purple",
        "colorTo": "gray",
        "sdk": "docker",
        "app_port": 7860,
        "pinned": False,
        "tags": ["corral", "reinforcement-learning", "text"],
        "short_description": "Echoes messages back.",
    }
    assert meta == staged.front_matter
    assert space_front_matter_errors(readme) == []
    body = readme.split("---\n", 2)[2]
    assert "https://my-org-echo-env.hf.space" in body
    assert "| `message` | `str` | yes |" in body
    assert "| `echoed_message` | `str` |  | `''` |" in body


def test_contract_markdown_types() -> None:
    text = contract_markdown(EchoEnv.contract().schemas)
    assert text.startswith("### Action: `EchoAction`")
    assert "| `reward` | `float \\| None` |  | `None` |" in text
    assert "| `metadata` | `dict` |" in text
    assert "### State: `EchoState`" in text


@pytest.mark.parametrize("repo_id", ["echo", "a/b/c", "-x/y", "me/..", "me/x.git", "me/ x", ""])
def test_bad_repo_ids(repo_id: str) -> None:
    with pytest.raises(SpaceError, match="must be OWNER/NAME"):
        check_repo_id(repo_id)


def test_bad_colors_are_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match="'teal' is not a Space colour"):
        stage_space(tmp_path, tmp_path / "out", "me/x", color_from="teal")
    assert not (tmp_path / "out").exists()


@pytest.mark.network
def test_push_uploads_with_the_real_client(staged: StagedSpace, fake_hub: FakeHub) -> None:
    pushed = push_space(
        staged.directory,
        "my-org/echo-env",
        token="hf_test_token",
        endpoint=fake_hub.url,
        commit_message="Publish echo 0.4.0",
    )
    assert pushed.url == f"{fake_hub.url}/spaces/my-org/echo-env"
    assert pushed.commit_url == f"{fake_hub.url}/spaces/my-org/echo-env/commit/c0ffee"

    (create,) = fake_hub.of("/api/repos/create")
    assert create.json() == {
        "name": "echo-env",
        "organization": "my-org",
        "type": "space",
        "sdk": "docker",
    }
    (validate,) = fake_hub.of("/api/validate-yaml")
    readme = (staged.directory / "README.md").read_text()
    assert validate.json() == {"content": readme, "repoType": "space"}

    (preupload,) = fake_hub.of("/api/spaces/my-org/echo-env/preupload/main")
    assert sorted(f["path"] for f in preupload.json()["files"]) == staged.files

    (commit,) = fake_hub.of("/api/spaces/my-org/echo-env/commit/main")
    header, *files = commit.ndjson()
    assert header == {
        "key": "header",
        "value": {"summary": "Publish echo 0.4.0", "description": ""},
    }
    uploaded = {f["value"]["path"]: base64.b64decode(f["value"]["content"]) for f in files}
    assert sorted(uploaded) == staged.files
    for path, content in uploaded.items():
        assert content == (staged.directory / path).read_bytes(), path
    assert {r.headers.get("authorization") for r in fake_hub.requests} == {"Bearer hf_test_token"}


@pytest.mark.network
def test_push_to_an_existing_space(staged: StagedSpace, fake_hub: FakeHub) -> None:
    fake_hub.existing.add("my-org/echo-env")
    push_space(staged.directory, "my-org/echo-env", token="hf_test_token", endpoint=fake_hub.url)
    assert len(fake_hub.of("/commit/main")) == 1


def test_push_refuses_bad_front_matter(tmp_path: Path, fake_hub: FakeHub) -> None:
    (tmp_path / "Dockerfile").write_text("FROM python:3.11-slim\n")
    (tmp_path / "README.md").write_text("---\nsdk: docker\ncolorFrom: teal\n---\n")
    with pytest.raises(ValueError, match='"colorFrom" must be one of'):
        push_space(tmp_path, "me/x", token="hf_test_token", endpoint=fake_hub.url)
    assert fake_hub.of("/commit/") == []


def test_push_with_a_bad_token(tmp_path: Path, fake_hub: FakeHub) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    (tmp_path / "Dockerfile").write_text("FROM python:3.11-slim\n")
    (tmp_path / "README.md").write_text("---\nsdk: docker\n---\n")
    with pytest.raises(HfHubHTTPError, match="401"):
        push_space(tmp_path, "me/x", token="wrong", endpoint=fake_hub.url)


def test_push_needs_a_staged_folder(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match=r"has no README\.md; stage it first"):
        push_space(tmp_path, "me/x", token="t", endpoint="http://127.0.0.1:9")
