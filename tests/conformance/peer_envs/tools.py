"""An OpenEnv ``MCPEnvironment`` with two FastMCP tools that see the episode's state."""

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State


class ToolsEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("tools")
        env = self

        @mcp.tool
        def add(a: int, b: int = 0) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool
        def steps() -> int:
            """How many steps this episode has taken."""
            return env._state.step_count

        super().__init__(mcp)
        self._state = State(episode_id="tools", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> Observation:
        self._state = State(episode_id=episode_id or "tools", step_count=0)
        return Observation(metadata={"tools": 2})

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    ToolsEnv, CallToolAction, CallToolObservation, env_name="tools", max_concurrent_envs=4
)
