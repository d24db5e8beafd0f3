"""An OpenEnv environment in the browser: its /schema and /metadata are OpenEnv's bodies,
so the UI takes the environment's identity from the corral/1 welcome."""

from __future__ import annotations

import importlib.util
import re

import pytest

pytest.importorskip("playwright")
if importlib.util.find_spec("openenv") is None:  # found, not imported: see the test
    pytest.skip("needs openenv-core (the test extra)", allow_module_level=True)

from playwright.async_api import expect
from tests.support.browser import open_ui
from tests.support.servers import running

from corral.adapters.openenv_env import from_openenv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


async def test_header_and_contract_panel_name_the_contract(context):
    # Imported here: openenv imports gradio (seconds of CPU), and every worker collects this.
    from tests.support.openenv_envs import CountEnv

    with running(from_openenv(CountEnv), web=True) as srv:
        ctx, _ = context
        page = await open_ui(ctx, srv.url)
        fingerprint = srv.service.fingerprint
        await expect(page.locator("#env-version")).to_have_text("contract 1.0.0")
        # The env's own fields first; OpenEnv's base `metadata` last, folded away.
        paths = await page.eval_on_selector_all(
            "#action .fields > .field, #action .fields > details .field",
            "els => els.map(e => e.dataset.path)",
        )
        assert paths == ["amount", "sleep", "metadata"]
        await expect(page.locator("#action details.base-field")).not_to_have_attribute("open", "")
        # A required bounded number without a default: an empty input, and a slider at
        # rest (dimmed, "not set"), not at either end pretending to be a value.
        slider = page.locator(".field[data-path=amount] input[type=range]")
        await expect(page.locator("#action-amount")).to_have_value("")
        await expect(slider).to_have_class(re.compile(r"\bunset\b"))
        await expect(slider).to_have_attribute("aria-valuetext", "not set")
        await expect(slider).to_have_value("0")
        await slider.fill("40")
        await expect(page.locator("#action-amount")).to_have_value("40")
        await expect(slider).not_to_have_class(re.compile(r"\bunset\b"))
        sleep = page.locator(".field[data-path=sleep] input[type=range]")
        await expect(sleep).to_have_value("0")  # its default
        await page.fill("#action-amount", "4")
        await expect(slider).to_have_value("4")
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(2)
        await page.click("#tab-contract")
        contract = page.locator("#contract")
        await expect(contract).to_contain_text(fingerprint)
        await expect(contract).not_to_contain_text("undefined")
        await page.close()
