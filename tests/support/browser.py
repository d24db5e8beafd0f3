"""Helpers for the web UI's browser tests (the fixtures are in tests/server/web/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playwright.async_api import expect

FIRST_LOAD_MS = 60_000
"""How long a tab's first load may take: it fetches every module, the schemas and a
session, which on a loaded 2-core machine takes several times an ordinary expectation's
wait (the conftest's 20 s)."""


async def js(page: Any, expression: str) -> Any:
    """The value of a JavaScript expression in ``page`` (``window.corral`` is the UI's state)."""
    return await page.evaluate(f"() => {expression}")


async def open_ui(ctx: Any, url: str, path: str = "/") -> Any:
    """A new tab on the UI, once its first episode has been reset."""
    page = await ctx.new_page()
    await page.goto(url + path)
    await expect(page.locator("#timeline li").first).to_be_visible(timeout=FIRST_LOAD_MS)
    return page


async def guess(page: Any, guesses: list[str]) -> None:
    """Step Wordle with each guess in turn, waiting for each to reach the timeline."""
    for word in guesses:
        count = await page.locator("#timeline li").count()
        await page.fill("#action-guess", word)
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(count + 1)


async def download(page: Any, button: str, directory: Path) -> Path:
    """Click ``button`` and save the file the page downloads into ``directory``."""
    async with page.expect_download() as waiting:
        await page.click(button)
    done = await waiting.value
    target = directory / done.suggested_filename
    await done.save_as(target)
    return target


async def screenshot(page: Any, name: str) -> None:
    """Save a screenshot for the docs when ``CORRAL_WEB_SCREENSHOTS`` names a directory."""
    target = os.environ.get("CORRAL_WEB_SCREENSHOTS")
    if not target:
        return
    path = Path(target) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(path))
    from PIL import Image  # a 256-colour palette keeps the docs' images small

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(256)
    small.save(path, optimize=True)
