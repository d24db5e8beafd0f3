"""Hugging Face Space staging, and uploads by huggingface_hub's real client to a fake Hub."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.support.fakehub import FakeHub, running_fake_hub, space_front_matter_errors

import corral
from corral.envs.echo import EchoEnv
from corral.providers.hfspace import (
    SHORT_DESCRIPTION_MAX,
    HubUnreachable,
    SpaceError,
    StagedSpace,
    check_repo_id,
    contract_markdown,
    push_space,
    short_description,
    stage_space,
)


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    with running_fake_hub() as hub:
        yield hub


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


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections (bound, never listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_an_unreachable_hub_is_one_clear_error(tmp_path: Path, closed_port: int) -> None:
    (tmp_path / "Dockerfile").write_text("FROM python:3.11-slim\n")
    (tmp_path / "README.md").write_text("---\nsdk: docker\n---\n")
    url = f"http://127.0.0.1:{closed_port}"
    with pytest.raises(HubUnreachable) as info:
        push_space(tmp_path, "me/x", token="hf_test_token", endpoint=url)
    assert str(info.value).startswith(f"the Hugging Face Hub at {url} is unreachable (")
    assert str(info.value).endswith(f"The Space is staged in {tmp_path}: push again when online")
    assert info.value.staged == tmp_path and "\n" not in str(info.value)


def test_the_hub_offline_mode_is_unreachable_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "Dockerfile").write_text("FROM python:3.11-slim\n")
    (tmp_path / "README.md").write_text("---\nsdk: docker\n---\n")
    with pytest.raises(HubUnreachable, match="offline mode is enabled"):
        push_space(tmp_path, "me/x", token="hf_test_token")


@pytest.mark.parametrize(
    ("text", "short"),
    [
        ("Echoes messages back.", "Echoes messages back."),
        (
            "Find a secret number between 0 and 100 from higher/lower hints, in ten guesses.",
            "Find a secret number between 0 and 100 from higher/lower…",
        ),
        ("word " * 20, "word word word word word word word word word word word…"),
        ("x" * 80, "x" * 59 + "…"),
        ("  spread\nover   lines  ", "spread over lines"),
    ],
)
def test_short_descriptions_end_at_a_word(text: str, short: str) -> None:
    assert short_description(text) == short
    assert len(short_description(text)) <= SHORT_DESCRIPTION_MAX
