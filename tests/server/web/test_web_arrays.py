"""Arrays in the browser: numbers, not base64 (issue 31, item 2) — a list, a grid for 2-D,
an image for HxWx3 uint8 with its numbers a click away, a cap that says it cut, and
state diffs that name the squares that changed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("playwright")

from playwright.async_api import expect
from pydantic import Field
from tests.support.browser import js, open_ui
from tests.support.servers import running

from corral.contract import Action, Environment, Observation, State
from corral.contract.arrays import Array

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

TIMES = "\u00d7"


class MoveAction(Action):
    row: int = Field(default=0, ge=0, le=2)
    col: int = Field(default=0, ge=0, le=2)


class BoardObservation(Observation):
    board: Array(dtype="int8", shape=(3, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros((3, 3), dtype=np.int8)
    )
    flat: Array(dtype="int8", shape=(9,)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros(9, dtype=np.int8)
    )
    noise: Array(dtype="float32") = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros(5000, dtype=np.float32)
    )
    picture: Array(dtype="uint8", shape=(2, 2, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    )


class BoardState(State):
    board: Array(dtype="int8", shape=(3, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros((3, 3), dtype=np.int8)
    )


class TicTacToeEnv(Environment[MoveAction, BoardObservation, BoardState]):
    """X plays where it is told; O answers in the first free square."""

    name = "tictactoe"

    def __init__(self) -> None:
        self._state = BoardState()

    def reset(self, seed: int | None = None, **options: Any) -> BoardObservation:
        self._state = BoardState()
        return self._observe()

    def step(self, action: MoveAction) -> BoardObservation:
        board = self._state.board.copy()
        board[action.row, action.col] = 1
        free = np.argwhere(board == 0)
        if len(free):
            board[tuple(free[0])] = -1
        self._state = BoardState(board=board, step_count=self._state.step_count + 1)
        return self._observe()

    def state(self) -> BoardState:
        return self._state

    def _observe(self) -> BoardObservation:
        board = self._state.board
        noise = np.linspace(0, 1, 5000, dtype=np.float32)
        return BoardObservation(board=board, flat=board.reshape(-1).copy(), noise=noise)


async def test_arrays_read_as_numbers(context):
    ctx, _ = context
    with running(TicTacToeEnv, web=True) as srv:
        page = await open_ui(ctx, srv.url)
        await page.fill("#action-row", "1")
        await page.fill("#action-col", "1")
        await page.click("#step")
        await expect(page.locator("#timeline li")).to_have_count(2)
        obs = page.locator("#observation")
        # 2-D: a grid of numbers.
        board = obs.locator("tr[data-field=board]")
        await expect(board.locator(".badge")).to_have_text(f"|i1 (3{TIMES}3)")
        cells = await board.locator("table.grid td").all_inner_texts()
        assert cells == ["-1", "0", "0", "0", "1", "0", "0", "0", "0"]
        # 1-D: a list.
        await expect(obs.locator("tr[data-field=flat] pre")).to_have_text("[-1,0,0,0,1,0,0,0,0]")
        # Large: cut, and it says so.
        noise = obs.locator("tr[data-field=noise]")
        await expect(noise.locator(".cut")).to_have_text(
            "showing the first values of 5,000 (at most 1,000)"
        )
        text = await noise.locator("pre").inner_text()
        assert text.startswith("[0,0.00020004") and text.rstrip().endswith('"… 4,000 more"]')
        # HxWx3 uint8: an image, and its numbers.
        picture = obs.locator("tr[data-field=picture]")
        await expect(picture.locator("canvas")).to_have_attribute("width", "2")
        await picture.locator("details summary").click()
        await expect(picture.locator("details pre")).to_have_text(
            "[[[0,1,2],\n  [3,4,5]],\n\n [[6,7,8],\n  [9,10,11]]]"
        )
        # Nowhere base64 (the board's first row, -1 0 0 as bytes, is "/wAA").
        assert "/wAA" not in await page.inner_text("#view-play")
        # The state diff names the squares, as numbers.
        diff = page.locator("#detail table.diff")
        await expect(diff.locator("tr", has_text="board[1][1]")).to_contain_text("1")
        await expect(diff.locator("tr", has_text="board[0][0]")).to_contain_text("-1")
        assert await diff.locator("tbody tr").count() == 3  # step_count and two squares
        # The timeline, the detail's action and the copied Python are numbers too.
        await page.click("#tab-inspector")
        await page.click("#copy-python")
        snippet = await page.inner_text("#snippet")
        await page.click("#snippet-close")
        assert 'env.step({"row": 1, "col": 1})' in snippet
        assert await js(page, "window.corral.episode.steps.length") == 2
