"""A connect4-style OpenEnv environment: no generic parameters and no annotations."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class Connect4Action(Action):
    column: int


class Connect4Observation(Observation):
    board: list = []
    legal_actions: list = []


class Connect4State(State):
    next_player: int = 1


class Connect4Env(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, rows=4, columns=5):
        super().__init__()
        self.rows, self.columns = rows, columns
        self._state = Connect4State()
        self.board = []

    def reset(self, seed=None, episode_id=None):
        self.board = [[0] * self.columns for _ in range(self.rows)]
        self._state = Connect4State(episode_id=episode_id or "c4", step_count=0)
        return Connect4Observation(
            board=self.board, legal_actions=list(range(self.columns)), metadata={"seed": seed}
        )

    def step(self, action):
        if not self.board:
            raise RuntimeError("call reset() first")
        column = action.column
        if not 0 <= column < self.columns or self.board[0][column]:
            return Connect4Observation(board=self.board, reward=-1.0, done=True)
        for row in reversed(range(self.rows)):
            if not self.board[row][column]:
                self.board[row][column] = self._state.next_player
                break
        self._state.step_count += 1
        self._state.next_player = 3 - self._state.next_player
        legal = [c for c in range(self.columns) if not self.board[0][c]]
        return Connect4Observation(board=self.board, legal_actions=legal, done=not legal)

    @property
    def state(self):
        return self._state

    # OpenEnv 0.10's web hooks (0.3 has none): corral's web UI maps them onto its own.
    def render_web(self, observation):
        rows = "".join(
            "<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
            for row in observation["board"]
        )
        return f"<table>{rows}</table>"

    def web_actions(self, observation):
        return [(f"column {c}", {"column": c}) for c in observation["legal_actions"]]


app = create_app(
    lambda: Connect4Env(rows=3, columns=4),
    Connect4Action,
    Connect4Observation,
    env_name="connect4",
    max_concurrent_envs=4,
)
