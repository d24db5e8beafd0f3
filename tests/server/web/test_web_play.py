"""Playing Wordle in the browser: forms, steps, errors, resets, tabs, views, snippets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from urllib.parse import unquote, urlencode

import pytest

pytest.importorskip("playwright")

from playwright.async_api import expect
from tests.support.browser import js, open_ui, screenshot
from tests.support.servers import running

from corral.envs.wordle import WordleEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
def wordle():
    with running(WordleEnv, web=True) as srv:
        yield srv


async def test_a_new_user_plays_wordle_and_sees_the_history(context, wordle):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    await expect(page.locator("#env-name")).to_have_text("wordle")
    assert await page.input_value("#seed") != ""  # a fresh seed, so the episode can be replayed
    await expect(page.locator("#conn")).to_have_text("connected")
    # The environment's own view: a sandboxed frame without scripts, and suggestions.
    frame = page.locator("#env-view")
    await expect(frame).to_be_visible()
    assert await frame.get_attribute("sandbox") == ""
    await expect(page.locator("#quick-actions button")).to_have_count(3)
    # Type a guess and press Enter.
    await page.fill("#action-guess", "crane")
    await page.press("#action-guess", "Enter")
    await expect(page.locator("#timeline li")).to_have_count(2)
    await expect(page.locator("#observation tr[data-field=guess] td")).to_have_text('"crane"')
    board = page.frame_locator("#env-view")
    await expect(board.locator(".row").first).to_contain_text("CRANE")
    # One click on a suggestion steps with it.
    suggestion = page.locator("#quick-actions button").first
    label = await suggestion.inner_text()
    await suggestion.click()
    await expect(page.locator("#timeline li")).to_have_count(3)
    await expect(page.locator("#timeline li").nth(2)).to_contain_text(label.removeprefix("try "))
    steps = await js(page, "window.corral.episode.steps.map(s => s.observation.guess)")
    assert steps == ["", "crane", label.removeprefix("try ")]
    ret = await js(page, "window.corral.episode.steps.slice(1).reduce((a, s) => a + s.reward, 0)")
    await expect(page.locator("[data-stat=return] b")).to_have_text(
        str(round(ret, 6)).rstrip("0").rstrip(".")
    )
    # Click the first step: its observation and the state diff against the reset.
    await page.locator("#timeline li").nth(1).locator("button").click()
    await expect(page.locator("#obs-step")).to_have_text("after step 1")
    diff = page.locator("#detail table.diff")
    await expect(diff).to_contain_text("step_count")
    await expect(diff).to_contain_text("guesses_made")
    await screenshot(page, "web-play")
    # Light and dark: the toggle overrides the system's choice.
    background = "() => getComputedStyle(document.body).backgroundColor"
    before = await page.evaluate(background)
    await page.click("#theme")
    assert await page.evaluate(background) != before
    await page.click("#theme")
    assert await page.evaluate(background) == before


async def test_a_failed_step_shows_an_error_card_and_the_session_lives_on(context, wordle):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    await page.fill("#action-guess", "abc")
    await page.click("#step")
    card = page.locator(".error-card")
    await expect(card).to_have_attribute("data-code", "INVALID_ACTION")
    await expect(card).to_contain_text("5 ASCII letters")
    field = page.locator(".field[data-path=guess]")
    await expect(field).to_have_class(re.compile(r"\binvalid\b"))
    await expect(field.locator(".field-error")).to_contain_text("5 ASCII letters")
    failed = page.locator("#timeline li.failed")
    await expect(failed).to_have_count(1)
    await expect(failed).to_contain_text("INVALID_ACTION")
    # The same session goes on.
    session = await js(page, "window.corral.session.id")
    await page.fill("#action-guess", "slate")
    await page.click("#step")
    await expect(page.locator(".error-card")).to_have_count(0)
    await expect(page.locator("#timeline li")).to_have_count(3)
    assert await js(page, "window.corral.session.id") == session
    await expect(field).not_to_have_class(re.compile(r"\binvalid\b"))


async def test_reset_with_a_seed_and_options_and_the_r_key(context, wordle):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    await page.click("#options-box summary")
    await page.fill("#options-value", '{"max_guesses": 3}')
    await page.fill("#seed", "42")
    await page.click("#reset")
    await expect(page.locator("#observation tr[data-field=guesses_left] td")).to_have_text("3")
    first = await js(page, "window.corral.episode.steps[0].state.secret")
    # r resets again with the same seed: the same secret.
    await page.fill("#action-guess", "crane")
    await page.click("#step")
    await expect(page.locator("#timeline li")).to_have_count(2)
    await page.locator("body").press("r")
    await expect(page.locator("#timeline li")).to_have_count(1)
    assert await js(page, "window.corral.episode.steps[0].state.secret") == first
    assert await js(page, "window.corral.episode.seed") == 42
    # A bad option is an error card; the session stays usable.
    await page.fill("#options-value", '{"bogus": 1}')
    await page.click("#reset")
    await expect(page.locator(".error-card")).to_have_attribute("data-code", "INVALID_ARGUMENT")
    await page.fill("#options-value", "")
    await page.click("#new-episode")
    await expect(page.locator(".error-card")).to_have_count(0)
    await expect(page.locator("#observation tr[data-field=guesses_left] td")).to_have_text("6")


async def test_two_tabs_have_two_independent_episodes(context, wordle):
    ctx, _ = context
    one = await open_ui(ctx, wordle.url)
    two = await open_ui(ctx, wordle.url)
    assert await js(one, "window.corral.session.id") != await js(two, "window.corral.session.id")
    await one.fill("#seed", "1")
    await one.click("#reset")
    await two.fill("#seed", "1")
    await two.click("#reset")
    await one.fill("#action-guess", "crane")
    await one.click("#step")
    await expect(one.locator("#timeline li")).to_have_count(2)
    await two.fill("#action-guess", "slate")
    await two.click("#step")
    await expect(two.locator("#timeline li")).to_have_count(2)
    history = "window.corral.episode.steps.at(-1).observation.history.map(h => h.guess)"
    assert await js(one, history) == ["crane"]
    assert await js(two, history) == ["slate"]
    assert wordle.manager.active >= 2


async def test_a_module_cut_while_loading_reloads_the_page(context, wordle):
    """A module fetch that fails (Chromium cuts requests in flight when a network
    interface changes, as each Docker container start does) leaves main.js unrun: the
    page reloads itself instead of saying "connecting…" for ever (boot.js)."""
    ctx, _ = context
    cut: list[str] = []

    async def cut_once(route):
        if not cut:
            cut.append(route.request.url)
            await route.abort("connectionreset")
        else:
            await route.continue_()

    await ctx.route("**/web/values.js", cut_once)
    page = await open_ui(ctx, wordle.url)
    assert cut == [wordle.url + "/web/values.js"]
    await expect(page.locator("#conn")).to_have_text("connected")
    assert await js(page, "sessionStorage.length") == 0  # the next load starts afresh


async def test_a_link_shows_its_actions_and_replays_them_only_when_asked(context, wordle):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    for guess in ("crane", "moist"):
        await page.fill("#action-guess", guess)
        await page.click("#step")
    await expect(page.locator("#timeline li")).to_have_count(3)
    link = page.url
    assert "actions=" in link and "seed=" in link
    copy = await open_ui(ctx, link.split("/web/", 1)[0], "/web/" + link.split("/web/", 1)[1])
    offer = copy.locator("#link-offer")
    await expect(offer).to_be_visible()
    await expect(offer.locator(".link-actions li")).to_have_text(
        ['{"guess":"crane"}', '{"guess":"moist"}']
    )
    # Nothing of the link was sent: the tab's own fresh episode, no step on the wire.
    await expect(copy.locator("#timeline li")).to_have_count(1)
    assert "step" not in await _sent_types(copy)
    await copy.click("#link-replay")
    await expect(copy.locator("#timeline li")).to_have_count(3)
    await expect(offer).to_be_hidden()
    observations = "window.corral.episode.steps.map(s => s.observation)"
    assert await js(copy, observations) == await js(page, observations)


async def _sent_types(page):
    return await page.eval_on_selector_all(
        "#frames tr.out td:nth-child(3)", "cells => cells.map(c => c.textContent)"
    )


async def test_a_hostile_link_is_shown_as_text_and_ignored(context, wordle):
    ctx, _ = context
    actions = json.dumps([{"guess": "<img src=x onerror=alert(1)>"}, {"guess": "crane"}])
    fragment = "#" + urlencode({"seed": "3", "actions": actions})
    page = await open_ui(ctx, wordle.url, "/web/" + fragment)
    offer = page.locator("#link-offer")
    await expect(offer.locator(".link-actions li").first).to_have_text(
        '{"guess":"<img src=x onerror=alert(1)>"}'
    )
    assert await page.locator("#link-offer img").count() == 0  # text, not markup
    await page.click("#link-ignore")
    await expect(offer).to_be_hidden()
    await expect(page.locator("#timeline li")).to_have_count(1)
    assert "step" not in await _sent_types(page)
    # The page's own episode is in the address again, not the link's.
    await page.fill("#action-guess", "slate")
    await page.click("#step")
    await expect(page.locator("#timeline li")).to_have_count(2)
    assert "onerror" not in unquote(page.url)
    # A link that is not an episode says so and replays nothing.
    bad = await open_ui(ctx, wordle.url, "/web/#seed=1&actions=%5B%7B")
    await expect(bad.locator("#link-offer")).to_contain_text("does not hold a readable episode")
    await expect(bad.locator("#link-replay")).to_have_count(0)


async def test_inspector_contract_and_copy_as_python_and_curl(context, wordle):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    await page.fill("#action-guess", "crane")
    await page.click("#step")
    await expect(page.locator("#timeline li")).to_have_count(2)
    await page.click("#tab-inspector")
    frames = page.locator("#frames tr")
    await expect(frames.first).to_be_visible()
    kinds = await page.eval_on_selector_all(
        "#frames tr td:nth-child(3)", "cells => cells.map(c => c.textContent)"
    )
    assert {"hello", "welcome", "open", "opened", "reset", "result", "step", "state"} <= set(kinds)
    await frames.nth(kinds.index("step")).click()
    assert '"guess": "crane"' in await page.inner_text("#frame")
    await screenshot(page, "web-inspector")
    # Copy as Python: the snippet runs and reproduces the step.
    await page.click("#copy-python")
    snippet = await page.inner_text("#snippet")
    await page.click("#snippet-close")
    assert f'AsyncEnvClient("{wordle.url}", codec="json")' in snippet
    ran = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert "guess='crane'" in ran.stdout
    # Copy as curl: the HTTP routes give the same step.
    await page.click("#copy-curl")
    commands = await page.inner_text("#snippet")
    await page.click("#snippet-close")
    ran = subprocess.run(["bash", "-e", "-c", commands], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert '"guess":"crane"' in ran.stdout.replace(" ", "")
    # The contract panel shows the server's schemas and fingerprint.
    await page.click("#tab-contract")
    schema = json.loads(await js(page, "JSON.stringify(window.corral.schema)"))
    await expect(page.locator("#contract")).to_contain_text(schema["fingerprint"])
    await expect(page.locator("#contract")).to_contain_text("max_frame_bytes")
    await expect(page.locator("#contract details.schema").first).to_contain_text("guess")
    await screenshot(page, "web-contract")


async def test_server_view_lists_live_sessions(context, wordle):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    session = await js(page, "window.corral.session.id")
    await page.click("#tab-server")
    await expect(page.locator("#server table.sessions")).to_contain_text(session.split("~")[1][:8])
    await expect(page.locator("#server [data-stat=active]")).to_contain_text("/ 1024")
    await expect(page.locator("#server svg.spark")).to_have_count(4)
    if os.environ.get("CORRAL_WEB_SCREENSHOTS"):  # let the sparklines gather a few samples
        for guess in ("crane", "slate", "moist"):
            await page.click("#tab-play")
            await page.fill("#action-guess", guess)
            await page.click("#step")
            await page.click("#tab-server")
            await page.wait_for_function("() => window.corral.server.last?.history.length > 1")
        await page.wait_for_function("() => window.corral.server.last.history.length >= 5")
    await screenshot(page, "web-server")


async def _watch_pill(page):
    """Record every text the connection pill shows from now on."""
    await page.evaluate(
        """() => {
            window.pillTexts = [];
            const pill = document.querySelector('#conn');
            new MutationObserver(() => window.pillTexts.push(pill.textContent))
                .observe(pill, {childList: true, characterData: true, subtree: true});
        }"""
    )


async def test_a_dropped_connection_comes_back_by_itself_with_its_session(context, wordle):
    ctx, _ = context
    page = await open_ui(ctx, wordle.url)
    first = await js(page, "window.corral.session.id")
    await page.fill("#action-guess", "crane")
    await page.click("#step")
    await expect(page.locator("#timeline li")).to_have_count(2)
    # The connection drops (not a clean close): the page reconnects with backoff and
    # re-attaches the session, without a click.
    await _watch_pill(page)
    await page.evaluate("() => window.corral.wire.ws.close(4000, 'test drop')")
    await expect(page.locator("#conn")).to_have_text("resumed")
    texts = await js(page, "window.pillTexts")
    assert any(
        re.match(r"disconnected \(4000\): reconnecting in [\d.]+ s \(attempt 1\)", t) for t in texts
    )
    assert await js(page, "window.corral.session.id") == first
    await page.fill("#action-guess", "moist")
    await page.click("#step")
    await expect(page.locator("#timeline li")).to_have_count(3)
    history = "window.corral.episode.steps.at(-1).observation.history.map(h => h.guess)"
    assert await js(page, history) == ["crane", "moist"]  # the same episode went on
    # Close the session, then open a new one.
    await page.click("#close")
    await expect(page.locator("#session-info")).to_have_text("session closed")
    await expect(page.locator("#step")).to_be_disabled()
    await page.click("#open")
    await expect(page.locator("#timeline li")).to_have_count(1)
    assert await js(page, "window.corral.session.id") != first
