"""The web UI's static files: served from package data, strict CSP, off by default."""

from __future__ import annotations

import gzip
import re
import zipfile

import httpx
import pytest
from tests.support.servers import running

from corral.envs.echo import EchoEnv
from corral.providers.dockerfile import corral_wheel
from corral.server.webui import CSP, WEB_DIR, is_public, load_assets

NDJSON = {"content-type": "application/x-ndjson"}

BUDGET = 152 * 1024  # 150 KiB, and boot.js (a load cut by a network change reloads)
"""The UI's files, all together, stay under this many bytes (issue 12)."""


@pytest.fixture(scope="module")
def server():
    with running(EchoEnv, web=True) as srv:
        yield srv


def test_bundle_fits_the_budget():
    assets = load_assets()
    assert {"index.html", "main.js", "style.css", "wire.js", "forms.js", "episode.js"} <= set(
        assets
    )
    total = sum(len(a.body) for a in assets.values())
    zipped = sum(len(gzip.compress(a.body, 9)) for a in assets.values())
    print(f"web UI bundle: {total} bytes, {zipped} gzipped, {len(assets)} files")
    assert total <= BUDGET


def test_no_file_names_another_host():
    # The browser tests record every request; this catches a stray URL early.
    for path in WEB_DIR.iterdir():
        text = path.read_text(encoding="utf-8").replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in text and "https://" not in text, path.name


async def test_redirects_and_files_with_a_strict_policy(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        for path in ("/", "/web"):
            moved = await http.get(path)
            assert moved.status_code == 307
            assert moved.headers["location"] == "web/"
        page = await http.get("/", follow_redirects=True)
        assert page.status_code == 200
        assert str(page.url).endswith("/web/")
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert '<script type="module" src="main.js">' in page.text
        script = await http.get("/web/main.js")
        assert script.headers["content-type"].startswith("text/javascript")
        again = await http.get("/web/main.js", headers={"If-None-Match": script.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        for missing in ("/web/nope.js", "/web/..%2Fapp.py", "/web/../server/app.py"):
            assert (await http.get(missing)).status_code == 404, missing


def test_the_page_preloads_every_module():
    # One round of parallel requests instead of a waterfall down the import graph: on a
    # loaded machine the page is up several round trips sooner.
    page = (WEB_DIR / "index.html").read_text()
    preloaded = set(re.findall(r'<link rel="modulepreload" href="([\w-]+\.js)">', page))
    modules = {p.name for p in WEB_DIR.glob("*.js")} - {"main.js", "boot.js"}  # the entries
    assert preloaded == modules


def test_policy_allows_only_this_origin():
    rules = dict(rule.split(" ", 1) for rule in CSP.split("; "))
    assert rules["default-src"] == "'none'"
    assert rules["script-src"] == "'self'"
    assert rules["connect-src"] == "'self'"
    assert "unsafe-eval" not in CSP and "unsafe-inline" not in rules["script-src"]


async def test_off_by_default():
    with running(EchoEnv) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            for path in ("/", "/web", "/web/", "/web/main.js", "/status", "/render"):
                assert (await http.get(path)).status_code == 404, path
            assert (await http.post("/auth")).status_code == 404


def test_public_paths_are_the_static_files_only():
    assert is_public("/") and is_public("/web") and is_public("/web/main.js")
    for private in ("/ws", "/status", "/render", "/regression", "/schema", "/webx", "/auth"):
        assert not is_public(private), private


@pytest.mark.network
def test_the_wheel_ships_the_ui():
    wheel = corral_wheel()
    if wheel is None:
        pytest.skip("corral is installed from a distribution, not a source tree")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for asset in load_assets():
        assert f"corral/server/web/{asset}" in names, asset


async def test_regression_turns_an_episode_file_into_a_pytest_module(tmp_path):
    from corral import episodes

    path = tmp_path / "one.jsonl"
    with episodes.EpisodeWriter(path, episodes.Header(source="test")) as out:
        recorder = episodes.EpisodeRecorder(out)
        recorder.reset("s", seed=3, observation={"echoed_message": "ready"})
        recorder.step("s", action={"message": "hi"}, observation={"echoed_message": "hi"})
    with running(EchoEnv, web=True, max_frame_bytes=2048) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            made = await http.post(
                "/regression", params={"url": srv.url}, content=path.read_bytes(), headers=NDJSON
            )
            assert made.status_code == 200
            assert made.headers["content-type"].startswith("text/x-python")
            compile(made.text, "test_x.py", "exec")
            # EchoEnv imports back by name: the module starts its own server from it.
            target = "corral.envs.echo:EchoEnv"
            assert made.headers["x-corral-env-target"] == target
            assert f"ENV = {target!r}" in made.text and "URL = None" in made.text
            for body, status in ((b"junk\n", 422), (b"", 422), (b"x" * 4096, 413)):
                refused = await http.post("/regression", content=body, headers=NDJSON)
                assert refused.status_code == status, body[:10]
                assert refused.json()["code"] in ("INVALID_ARGUMENT", "FRAME_TOO_LARGE")


async def test_regression_names_the_server_when_the_env_has_no_target(tmp_path):
    from corral import episodes

    path = tmp_path / "one.jsonl"
    with episodes.EpisodeWriter(path, episodes.Header(source="test")) as out:
        episodes.EpisodeRecorder(out).reset("s", seed=1, observation={"echoed_message": ""})
    with running(lambda: EchoEnv(), web=True) as srv:  # a factory made at run time
        async with httpx.AsyncClient(base_url=srv.url) as http:
            made = await http.post(
                "/regression", params={"url": srv.url}, content=path.read_bytes(), headers=NDJSON
            )
    assert made.status_code == 200
    assert "x-corral-env-target" not in made.headers
    assert f"URL = {srv.url!r}" in made.text and "ENV = None" in made.text
