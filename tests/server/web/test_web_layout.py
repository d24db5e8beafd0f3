"""The page's layout in Chromium: no sideways scroll, and the step detail (the state
diff) in view beside a long observation (issue 31, items 9 and 11)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("playwright")

from playwright.async_api import expect
from pydantic import create_model
from tests.support.browser import open_ui
from tests.support.servers import running
from tests.support.web_envs import SinkEnv

from corral.contract import Action, Environment, Observation, State
from corral.envs.wordle import WordleEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

FIELDS = 40


class TallAction(Action):
    n: int = 0


# Forty fields: a table far taller than the window.
TallObservation = create_model(
    "TallObservation", __base__=Observation, **{f"f{i:02}": (str, "") for i in range(FIELDS)}
)


class TallState(State):
    n: int = 0


class TallEnv(Environment[TallAction, TallObservation, TallState]):  # type: ignore[valid-type]
    name = "tall"

    def __init__(self) -> None:
        self._state = TallState()

    def reset(self, seed: int | None = None, **options: Any) -> Observation:
        self._state = TallState()
        return self._observe()

    def step(self, action: TallAction) -> Observation:
        self._state.step_count += 1
        self._state.n += action.n
        return self._observe()

    def state(self) -> TallState:
        return self._state

    def _observe(self) -> Observation:
        values = {f"f{i:02}": f"value {i} at n={self._state.n}" for i in range(FIELDS)}
        return TallObservation(**values)


SCROLL = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"


@pytest.mark.parametrize("env", [WordleEnv, SinkEnv], ids=["wordle", "sink"])
async def test_the_page_never_scrolls_sideways(context, env):
    ctx, _ = context
    with running(env, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        for width in (1400, 1000, 700):
            await page.set_viewport_size({"width": width, "height": 900})
            scroll, client = await page.evaluate(SCROLL)
            assert scroll <= client, f"{scroll} px of page in a {client} px window at {width}"
        # The hidden file input is still what the Import label opens.
        box = await page.locator("#import").bounding_box()
        assert box is not None and box["width"] <= 1 and box["height"] <= 1


async def test_the_state_diff_is_in_view_beside_a_long_observation(context):
    ctx, _ = context
    with running(TallEnv, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        assert await page.locator("#observation tr").count() >= FIELDS
        await page.fill("#action-n", "3")
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(2)
        diff = page.locator("#detail table.diff")
        await expect(diff).to_contain_text("n")
        height = await page.evaluate("() => innerHeight")
        for locator in (page.locator("#h-detail"), diff):
            box = await locator.bounding_box()
            assert box is not None and box["y"] + box["height"] <= height, box
        assert await page.evaluate("() => scrollY") == 0
        # The observation scrolls inside its card instead.
        inner = page.locator(".obs-body")
        assert await inner.evaluate("el => el.scrollHeight > el.clientHeight")
