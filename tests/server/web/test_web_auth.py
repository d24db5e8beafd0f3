"""The token flow in a browser: asked once, exchanged for an HttpOnly cookie, never in a URL."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright")

from playwright.async_api import expect
from tests.support.servers import running

from corral.auth import COOKIE_NAME
from corral.envs.wordle import WordleEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

TOKEN = "browser-token-abc123"


async def test_the_ui_asks_for_the_token_once_and_uses_a_cookie(context):
    ctx, traffic = context
    with running(WordleEnv, web=True, token=TOKEN) as srv:
        page = await ctx.new_page()
        await page.goto(srv.url + "/")
        dialog = page.locator("#token-dialog")
        await expect(dialog).to_be_visible()
        assert srv.manager.active == 0  # nothing was opened without the token
        await page.fill("#token", "wrong-token-0000")
        await page.click("#token-submit")
        await expect(page.locator("#token-error")).to_contain_text("wrong bearer token")
        await page.fill("#token", TOKEN)
        await page.press("#token", "Enter")
        await expect(dialog).to_be_hidden()
        await expect(page.locator("#timeline li")).to_have_count(1)
        await page.fill("#action-guess", "crane")
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(2)
        # The cookie: HttpOnly (the page's scripts cannot read it), SameSite=Strict.
        [cookie] = [c for c in await ctx.cookies() if c["name"] == COOKIE_NAME]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["value"] != TOKEN and TOKEN not in cookie["value"]
        assert COOKIE_NAME not in await page.evaluate("() => document.cookie")
        # The server view is behind the same auth and works with the cookie.
        await page.click("#tab-server")
        await expect(page.locator("#server table.sessions")).to_be_visible()
        # A second tab needs no token: the cookie is there.
        second = await ctx.new_page()
        await second.goto(srv.url + "/web/")
        await expect(second.locator("#timeline li")).to_have_count(1)
        await expect(second.locator("#token-dialog")).to_be_hidden()
        assert srv.manager.active >= 2
    assert not any(TOKEN in url for url in traffic.requests)
    assert any(url.startswith("ws://127.0.0.1") for url in traffic.requests)
