"""A session the server no longer holds: the page keeps its episode, says so, and restores
it in a new session by replay (issue 31, item 8), or from the snapshot of its last step
where the environment declares snapshots, from which any step can also be branched
(issue 29).

The resume window passes for real: the context goes offline (the page's reconnect
attempts fail, as they would against a server out of reach), the test waits until the
server has reaped the detached session, then lets the page back online.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

pytest.importorskip("playwright")

from playwright.async_api import expect
from tests.support.browser import download, guess, js, open_ui
from tests.support.servers import running
from tests.support.web_envs import ReplayOnlyWordle

from corral import episodes
from corral.envs.wordle import WordleEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

HISTORY = "window.corral.episode.steps.at(-1).observation.history.map(h => h.guess)"


async def until(predicate, timeout: float = 30.0) -> None:
    """Wait for the server-side ``predicate`` (polled; the page runs meanwhile)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting on the server"
        await asyncio.sleep(0.05)


async def test_an_expired_session_keeps_its_episode_and_is_restored_by_replay(context, tmp_path):
    ctx, _ = context
    with running(ReplayOnlyWordle, web=True, resume_window_s=0.5) as srv:
        page = await open_ui(ctx, srv.url)
        await guess(page, ["crane", "slate"])
        old = await js(page, "window.corral.session.id")
        before = await js(page, "window.corral.episode.steps.map(s => s.observation)")
        await ctx.set_offline(True)
        await page.evaluate("() => window.corral.wire.ws.close(4000, 'test drop')")
        await expect(page.locator("#conn")).to_contain_text("reconnecting")
        await until(lambda: old not in srv.manager.sessions)  # the window passed
        await ctx.set_offline(False)
        # The page says so and keeps the episode: all three timeline entries, read-only.
        banner = page.locator("#session-banner .banner")
        await expect(banner).to_contain_text("The session expired")
        await expect(banner).to_have_attribute("data-code", "SESSION_LOST")
        await expect(banner).to_contain_text("connection lost and not resumed in time")
        await expect(page.locator("#timeline li")).to_have_count(3)
        await expect(page.locator(".stat.pill")).to_have_text("expired session")
        await expect(page.locator("#step")).to_be_disabled()
        await expect(page.locator("#conn")).to_contain_text("expired")
        assert await js(page, "window.corral.episode.steps.map(s => s.observation)") == before
        # It is exportable as it was.
        [kept] = episodes.read(await download(page, "#export", tmp_path))
        assert kept.actions == [{"guess": "crane"}, {"guess": "slate"}]
        assert kept.observations == before
        # Restore: a new session, the actions replayed and compared, then play on.
        await expect(page.locator("#restore")).to_be_enabled()
        await page.click("#restore")
        note = page.locator("#episode-note .restore-result")
        await expect(note).to_contain_text("restored: replayed 2 actions")
        await expect(note).to_contain_text("every observation identical")
        await expect(page.locator("#session-banner .banner")).to_have_count(0)
        new = await js(page, "window.corral.session.id")
        assert new != old and new in srv.manager.sessions
        assert await js(page, "window.corral.episode.steps.map(s => s.observation)") == before
        await expect(page.locator("#step")).to_be_enabled()
        await guess(page, ["moist"])
        assert await js(page, HISTORY) == ["crane", "slate", "moist"]
        # The expired episode stays in the list, to look at or export again.
        options = page.locator("#episode-select option")
        await expect(options).to_have_count(2)
        await expect(options.nth(1)).to_contain_text("expired session")
        await page.select_option("#episode-select", index=1)
        await expect(page.locator("#timeline li")).to_have_count(3)
        await expect(page.locator("#step")).to_be_disabled()


async def test_a_session_reaped_while_idle_is_caught_at_the_next_step(context):
    ctx, _ = context
    with running(ReplayOnlyWordle, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        await guess(page, ["crane"])
        # Only now: on a loaded machine the page's first guess can come more than 1 s
        # after its reset, and the session would expire before it (the reaper reads it).
        srv.manager.registry.idle_timeout_s = 1.0
        old = await js(page, "window.corral.session.id")
        await until(lambda: old not in srv.manager.sessions)
        await page.fill("#action-guess", "slate")
        await page.click("#step")
        banner = page.locator("#session-banner .banner")
        await expect(banner).to_contain_text("The session expired")
        await expect(banner).to_contain_text(re.compile(r"idle for more than 1 s"))
        # The step that met the closed session is not in the timeline: it never ran.
        await expect(page.locator("#timeline li")).to_have_count(2)
        await expect(page.locator("#session-info")).to_contain_text("new session")
        await page.click("#restore")
        await expect(page.locator("#episode-note .restore-result")).to_contain_text(
            "restored: replayed 1 action"
        )
        await guess(page, ["slate"])
        assert await js(page, HISTORY) == ["crane", "slate"]


async def test_an_expired_session_comes_back_from_its_snapshot_and_any_step_branches(context):
    ctx, _ = context
    with running(WordleEnv, web=True, resume_window_s=0.5) as srv:
        page = await open_ui(ctx, srv.url)
        await guess(page, ["crane", "slate"])
        # One snapshot per step played: the reset's and each guess's.
        assert await js(page, "[...window.corral.episode.snapshots.keys()]") == [0, 1, 2]
        old = await js(page, "window.corral.session.id")
        before = await js(page, "window.corral.episode.steps.map(s => s.observation)")
        await ctx.set_offline(True)
        await page.evaluate("() => window.corral.wire.ws.close(4000, 'test drop')")
        await until(lambda: old not in srv.manager.sessions)
        await ctx.set_offline(False)
        banner = page.locator("#session-banner .banner")
        await expect(banner).to_contain_text("from the server's snapshot of its last step")
        await expect(page.locator("#restore")).to_have_text("Restore (from its snapshot)")
        steps_before = srv.manager.stats.steps
        await page.click("#restore")
        note = page.locator("#episode-note .restore-result")
        await expect(note).to_contain_text("restored from the server's snapshot (3 steps)")
        new = await js(page, "window.corral.session.id")
        assert new != old and new in srv.manager.sessions
        assert srv.manager.stats.restores == 1 and srv.manager.stats.steps == steps_before
        assert await js(page, "window.corral.episode.steps.map(s => s.observation)") == before
        await guess(page, ["moist"])
        assert await js(page, HISTORY) == ["crane", "slate", "moist"]
        # Branch from the first guess: a new session in that state, and play another way.
        await page.locator("#timeline li button").nth(1).click()
        await page.click("#branch")
        await expect(page.locator("#episode-note .branch-result")).to_contain_text(
            "branched from step 1"
        )
        await expect(page.locator("#timeline li")).to_have_count(2)
        branched = await js(page, "window.corral.session.id")
        assert branched not in (old, new) and new not in srv.manager.sessions
        await guess(page, ["pious"])
        assert await js(page, HISTORY) == ["crane", "pious"]
        expired = "window.corral.book.kept.find(e => e.kept === 'expired').steps.length"
        assert await js(page, expired) == 3  # what it was when it expired
        labels = await page.locator("#episode-select option").all_text_contents()
        assert any("left for a branch" in label for label in labels), labels
        assert any("expired session" in label for label in labels), labels
