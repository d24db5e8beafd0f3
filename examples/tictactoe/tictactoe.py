"""Tic-tac-toe against a random opponent: a typed ``row``/``col`` action and an ``int8``
board array, the kind of environment a user writes first.

You play ``X`` (1 on the board) and move first; the opponent, ``O`` (-1), answers with a
random empty cell (``reset(seed=...)`` seeds its choices; a reset without a seed goes on
with the same random stream, as Gymnasium environments do, so a seeded first episode
makes every later one reproducible). A win is +1, a loss -1, a draw 0. A
move to a taken cell is refused by the rules of the game, not by the contract: it costs
-1 and ends the game, so what a learner has to find first is simply the empty cells (a
random policy loses most games that way), then how to win.

    corral serve examples/tictactoe          # corral.yaml names TicTacToeEnv
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from pydantic import Field

from corral.contract import Action, Environment, Observation, State
from corral.contract.arrays import Array

CELLS = [(r, c) for r in range(3) for c in range(3)]
_WINS = [
    *([(r, 0), (r, 1), (r, 2)] for r in range(3)),
    *([(0, c), (1, c), (2, c)] for c in range(3)),
    [(0, 0), (1, 1), (2, 2)],
    [(0, 2), (1, 1), (2, 0)],
]


class MoveAction(Action):
    """Put your X on an empty cell."""

    row: int = Field(ge=0, le=2, description="The row, 0 (top) to 2 (bottom).")
    col: int = Field(ge=0, le=2, description="The column, 0 (left) to 2 (right).")


class BoardObservation(Observation):
    """The board after your move and the opponent's answer."""

    board: Array("int8", (3, 3)) = Field(  # type: ignore[valid-type]
        default_factory=lambda: np.zeros((3, 3), dtype=np.int8),
        description="1 is your X, -1 the opponent's O, 0 an empty cell.",
    )
    moves: int = Field(default=0, ge=0, le=9, description="Marks on the board.")


class TicTacToeEnv(Environment[MoveAction, BoardObservation, State]):
    """Tic-tac-toe as X against a random O: win +1, loss -1, a taken cell -1 and over."""

    name = "tictactoe"
    description = (
        "Tic-tac-toe: you are X (1) and move first, the opponent O (-1) plays a random "
        "empty cell. Win +1, loss -1, draw 0; a move to a taken cell costs -1 and ends "
        "the game."
    )

    def __init__(self) -> None:
        self.board = np.zeros((3, 3), dtype=np.int8)
        self.rng = random.Random()
        self._state = State()

    def reset(self, seed: int | None = None, **options: Any) -> BoardObservation:
        self.board = np.zeros((3, 3), dtype=np.int8)
        if seed is not None:
            self.rng = random.Random(seed)
        self._state = State()
        return self._observe()

    def step(self, action: MoveAction) -> BoardObservation:
        self._state.step_count += 1
        if self.board[action.row, action.col] != 0:
            return self._observe(reward=-1.0, done=True, why="that cell is taken")
        self.board[action.row, action.col] = 1
        if _won(self.board, 1):
            return self._observe(reward=1.0, done=True, why="you won")
        empty = [cell for cell in CELLS if self.board[cell] == 0]
        if not empty:
            return self._observe(reward=0.0, done=True, why="a draw")
        self.board[self.rng.choice(empty)] = -1
        if _won(self.board, -1):
            return self._observe(reward=-1.0, done=True, why="the opponent won")
        if len(empty) == 1:
            return self._observe(reward=0.0, done=True, why="a draw")
        return self._observe(reward=0.0)

    def state(self) -> State:
        return self._state

    def _observe(
        self, *, reward: float | None = None, done: bool = False, why: str = ""
    ) -> BoardObservation:
        return BoardObservation(
            board=self.board.copy(),
            moves=int(np.count_nonzero(self.board)),
            reward=reward,
            done=done,
            metadata={"result": why} if why else {},
        )


def _won(board: np.ndarray[Any, Any], mark: int) -> bool:
    return any(all(board[cell] == mark for cell in line) for line in _WINS)
