"""Models with numpy array fields: equality, list defaults, and both codecs (issue 31)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import Field, ValidationError
from tests.support.servers import running

from corral.client import AsyncEnvClient
from corral.contract import Action, Environment, Observation, State, WireModel
from corral.contract.arrays import Array, NDArray, values_equal
from corral.protocol.codecs import JsonCodec, MsgpackCodec

CODECS = [MsgpackCodec(), JsonCodec()]


class Cell(WireModel):
    mask: NDArray


class Board(Observation):
    board: Array(dtype="int8", shape=(3, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: [[0] * 3 for _ in range(3)]
    )
    cells: list[Cell] = Field(default_factory=list)
    heat: dict[str, NDArray] = Field(default_factory=dict)
    last: NDArray | None = None


def test_models_with_arrays_compare_by_dtype_shape_and_values() -> None:
    a = Board(cells=[Cell(mask=np.ones(2))], heat={"h": np.zeros((1, 2))})
    b = Board(cells=[Cell(mask=np.ones(2))], heat={"h": np.zeros((1, 2))})
    assert a == b
    assert not a.__ne__(b)
    assert a != Board(cells=[Cell(mask=np.ones(2))], heat={"h": np.ones((1, 2))})
    assert a != Board(cells=[Cell(mask=np.ones(3))], heat={"h": np.zeros((1, 2))})
    assert Cell(mask=np.ones(2, "int64")) != Cell(mask=np.ones(2, "float64"))  # dtype counts
    assert Cell(mask=np.array([np.nan])) != Cell(mask=np.array([np.nan]))  # as a float field
    assert Board() != Board(last=np.zeros(1)) and Board(last=np.zeros(1)) != Board()
    assert Board() != "a board" and Board().__eq__(object()) is NotImplemented
    assert values_equal([np.ones(1)], [np.ones(1)]) and not values_equal(
        [np.ones(1)], (np.ones(1),)
    )


def test_a_list_default_becomes_a_checked_array() -> None:
    board = Board()
    assert isinstance(board.board, np.ndarray) and board.board.dtype == np.int8
    assert board.board.shape == (3, 3) and Board().board is not board.board

    class Bad(Observation):
        grid: Array(dtype="int8", shape=(2, 2)) = Field(  # type: ignore[valid-type]
            default_factory=lambda: [[0, 0, 0]]
        )

    with pytest.raises(ValidationError, match=r"expected shape \(2, 2\)"):
        Bad()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_defaults_and_arrays_cross_both_codecs(codec: Any) -> None:
    for board in (Board(), Board(cells=[Cell(mask=np.arange(4.0))], last=np.eye(2))):
        wire = codec.decode(codec.encode({"o": codec.dump(board)}))["o"]
        assert codec.load(Board, wire) == board


class Move(Action):
    row: int = Field(ge=0, le=2)
    col: int = Field(ge=0, le=2)


class TicTacToe(Environment[Move, Board, State]):
    """The issue's own case: an int8 board array, with a list default."""

    def __init__(self) -> None:
        self.board = Board()

    def reset(self, seed: int | None = None, **options: Any) -> Board:
        self.board = Board()
        return self.board

    def step(self, action: Move) -> Board:
        grid = self.board.board.copy()
        grid[action.row, action.col] = 1
        self.board = Board(board=grid, reward=1.0)
        return self.board

    def state(self) -> State:
        return State()


@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_an_array_observation_through_a_real_server(codec: str) -> None:
    with running(TicTacToe) as server:
        async with AsyncEnvClient(server.url, env=TicTacToe, codec=codec) as env:
            first = await env.reset()
            assert first.observation == Board()
            moved = await env.step(Move(row=1, col=2))
            expected = np.zeros((3, 3), np.int8)
            expected[1, 2] = 1
            assert moved.observation == Board(board=expected, reward=1.0)
