"""An OpenEnv environment in the browser: its /schema and /metadata are OpenEnv's bodies,
so the UI takes the environment's identity from the corral/1 welcome."""

from __future__ import annotations

import importlib.util

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
        await page.fill("#action-amount", "4")
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(2)
        await page.click("#tab-contract")
        contract = page.locator("#contract")
        await expect(contract).to_contain_text(fingerprint)
        await expect(contract).not_to_contain_text("undefined")
        await page.close()
