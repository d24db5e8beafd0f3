"""Episodes in the browser: export and import in corral.episodes' format (both ways),
replay, the determinism check, and the exported pytest regression test."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("playwright")

from playwright.async_api import expect
from tests.support.browser import download, guess, js, open_ui, screenshot
from tests.support.servers import running
from tests.support.web_envs import FlakyCoinEnv

from corral import episodes
from corral.client import SyncEnvClient
from corral.envs.wordle import WordleEnv
from corral.errors import CorralError

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
def wordle():
    with running(WordleEnv, web=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def flaky():
    with running(FlakyCoinEnv, web=True) as srv:
        yield srv


async def test_an_exported_episode_is_read_by_python(context, wordle, tmp_path):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    await guess(page, ["crane", "abc", "zzzzz", "moist"])
    path = await download(page, "#export", tmp_path)
    assert path.suffix == ".jsonl"
    [episode] = episodes.read(path)
    assert episode.header.source == "web"
    assert episode.header.env.name == "wordle"
    assert episode.header.env.fingerprint == wordle.service.fingerprint
    assert episode.seed == int(await page.input_value("#seed"))
    assert [r.op for r in episode.records] == ["reset", "step", "step", "step", "step"]
    assert episode.actions == [{"guess": g} for g in ("crane", "abc", "zzzzz", "moist")]
    assert episode.records[2].error is not None
    assert episode.records[2].error.code == "INVALID_ACTION"
    assert episode.records[2].observation is None
    shown = await js(page, "window.corral.episode.steps.map(s => s.observation)")
    assert episode.observations == shown
    assert all(r.latency_s is not None and r.latency_s >= 0 for r in episode.records)
    assert all(r.state is not None for r in episode.records if r.error is None)
    assert abs(episode.records[0].t - time.time()) < 600
    assert not episode.complete  # still running: no end line


def _record_with_python(url: str, path, games) -> None:
    """Record each ``(seed, words)`` game with the Python client, a session each."""
    with (
        episodes.EpisodeWriter(path, episodes.Header(source="test")) as out,
        SyncEnvClient.connect_to(url, codec="json") as env,
    ):
        recorder = episodes.EpisodeRecorder(out)
        for n, (seed, words) in enumerate(games, start=1):
            session = f"s{n}"
            first = env.reset(seed=seed)
            recorder.reset(session, seed=seed, observation=first.observation, t=time.time())
            for word in words:
                try:
                    result = env.step({"guess": word})
                except CorralError as exc:
                    recorder.step(session, action={"guess": word}, error=exc, t=time.time())
                    continue
                recorder.step(session, action={"guess": word}, observation=result.observation)


async def test_a_python_file_is_imported_replayed_and_verified(context, wordle, tmp_path):
    ctx, _ = context
    path = tmp_path / "python.jsonl"
    _record_with_python(wordle.url, path, [(5, ["crane", "hello", "qqqqq"])])
    [recorded] = episodes.read(path)
    page = await open_ui(ctx, wordle.url)
    await page.set_input_files("#import", str(path))
    await expect(page.locator("[data-stat] ~ .pill, .stat.pill")).to_have_text("imported episode")
    await expect(page.locator("#timeline li")).to_have_count(4)
    await expect(page.locator("#step")).to_be_disabled()
    await page.locator("#timeline li").nth(2).locator("button").click()
    await expect(page.locator("#observation tr[data-field=guess] td")).to_have_text('"hello"')
    # Verify: a fresh session gives the same observations.
    await page.click("#verify")
    await expect(page.locator("#episode-note .verify-result")).to_contain_text("deterministic")
    await expect(page.locator("#episode-note .verify-result")).not_to_contain_text("not")
    # Replay it in this tab's session: the same observations, now live.
    await page.click("#replay-imported")
    await expect(page.locator("#timeline li")).to_have_count(4)
    await expect(page.locator("#step")).to_be_enabled()
    live = await js(page, "window.corral.episode.steps.map(s => s.observation)")
    assert live == recorded.observations
    await screenshot(page, "web-replay")


async def test_a_file_of_many_episodes_offers_a_picker(context, wordle, tmp_path):
    ctx, _ = context
    path = tmp_path / "three.jsonl"
    games = [(10, ["crane"]), (11, ["slate", "moist"]), (12, ["fjord", "crane", "abc"])]
    _record_with_python(wordle.url, path, games)
    recorded = episodes.read(path)
    assert len(recorded) == 3
    page = await open_ui(ctx, wordle.url)
    await page.set_input_files("#import", str(path))
    await expect(page.locator("#import-note")).to_contain_text("3 episodes")
    options = page.locator("#episode-select option")
    await expect(options).to_have_count(4)  # the live episode and the file's three
    labels = await options.all_inner_texts()
    assert labels[0].startswith("live")
    assert [label.split(" · ")[2] for label in labels[1:]] == ["seed 10", "seed 11", "seed 12"]
    await expect(page.locator("#timeline li")).to_have_count(2)  # the first is shown
    await page.select_option("#episode-select", index=3)
    await expect(page.locator("#timeline li")).to_have_count(4)
    await expect(page.locator("#timeline li.failed")).to_have_count(1)
    shown = await js(page, "window.corral.episode.steps.map(s => s.observation)")
    assert shown == recorded[2].observations
    # Replay the picked one in this tab's session, then go back to the others.
    await page.click("#replay-imported")
    await expect(page.locator("#step")).to_be_enabled()
    assert await js(page, "window.corral.episode.seed") == 12
    assert await js(page, "window.corral.episode.steps.map(s => s.observation)") == shown
    await page.select_option("#episode-select", index=2)
    await expect(page.locator("#timeline li")).to_have_count(3)
    await expect(page.locator("#step")).to_be_disabled()


async def test_the_determinism_check_catches_a_non_deterministic_env(context, flaky):
    ctx, _ = context
    page = await open_ui(ctx, flaky.url)
    for _ in range(2):
        count = await page.locator("#timeline li").count()
        await page.check("#action-call-0")  # heads
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(count + 1)
    await page.click("#verify")
    note = page.locator("#episode-note .verify-result")
    await expect(note).to_contain_text("not deterministic: step 1 differs")
    await expect(page.locator("#timeline li.diverged")).to_have_count(1)
    await expect(page.locator("#detail")).to_contain_text("replay differs here")
    await expect(page.locator("#detail table.diff").first).to_contain_text("roll")
    assert flaky.manager.active == 1  # the check's own session is closed again


def _run_pytest(test_file, url=None):
    # The exported test needs no plugin; not loading this venv's many saves seconds.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("CORRAL_URL", None)
    if url is not None:
        env["CORRAL_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=test_file.parent,
    )


async def test_the_exported_pytest_passes_and_catches_a_change(context, wordle, flaky, tmp_path):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    await guess(page, ["crane", "abc", "slate"])
    test_file = await download(page, "#export-pytest", tmp_path)
    assert test_file.name == "test_wordle_episode.py"
    assert "corral replay --pytest" in test_file.read_text()  # the one template
    ran = _run_pytest(test_file, wordle.url)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout
    # The same test against a different environment fails, saying where.
    flaky_page = await open_ui(ctx, flaky.url)
    await flaky_page.check("#action-call-1")  # tails
    await flaky_page.click("#step")
    await expect(flaky_page.locator("#timeline li")).to_have_count(2)
    flaky_test = await download(flaky_page, "#export-pytest", tmp_path)
    failed = _run_pytest(flaky_test, flaky.url)
    # The flip may match by chance; the roll (a random float) does not.
    assert failed.returncode == 1, failed.stdout
    assert "step 1 differs at observation." in failed.stdout
    assert "1 failed" in failed.stdout


async def test_the_exported_pytest_starts_its_own_server_once_the_first_is_gone(context, tmp_path):
    ctx, _ = context
    with running(WordleEnv, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        await guess(page, ["crane", "slate"])
        test_file = await download(page, "#export-pytest", tmp_path)
        await expect(page.locator("#episode-note .export-result")).to_contain_text(
            "it starts corral.envs.wordle.env:WordleEnv in a server of its own"
        )
        gone = srv.url
        await page.close()
    source = test_file.read_text()
    assert "ENV = 'corral.envs.wordle.env:WordleEnv'" in source
    assert "URL = None" in source and gone not in source.split("EPISODES")[0]
    ran = _run_pytest(test_file)  # no CORRAL_URL, and the exporting server is gone
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout


async def test_an_env_without_a_target_exports_a_test_that_names_its_server(context, tmp_path):
    ctx, _ = context
    with running(lambda: FlakyCoinEnv(), web=True) as srv:
        page = await open_ui(ctx, srv.url)
        test_file = await download(page, "#export-pytest", tmp_path)
        await expect(page.locator("#episode-note .export-result")).to_contain_text(
            "cannot be imported by name"
        )
        source = test_file.read_text()
        assert f"URL = {srv.url!r}" in source and "ENV = None" in source
