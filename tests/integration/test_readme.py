"""The README's own example environment works as printed."""

from __future__ import annotations

import re
import types
from pathlib import Path

from tests.support.servers import running

from corral.client import AsyncEnvClient

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_module() -> types.ModuleType:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    module = types.ModuleType("readme_example")
    exec(compile(blocks[0], "README.md", "exec"), module.__dict__)
    return module


async def test_readme_environment_plays_an_episode():
    example = readme_module()
    with running(example.HighLow) as srv:
        async with AsyncEnvClient(srv.url, env=example.HighLow) as env:
            await env.reset(seed=3)
            low, high, result = 0, 100, None
            for _ in range(10):
                guess = (low + high) // 2
                result = await env.step(example.Guess(number=guess))
                if result.done:
                    break
                if result.observation.hint == "higher":
                    low = guess + 1
                else:
                    high = guess - 1
            assert result is not None and result.terminated and result.reward == 1.0
