"""An LLM trained end to end: TRL's GRPOTrainer, corral's environment_factory, a served
multi-turn environment (examples/bandit/train_grpo.py, as a user runs it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

# Found, not imported: trl, transformers and torch take seconds to import, and every
# pytest-xdist worker collects this module.
if importlib.util.find_spec("trl") is None:
    pytest.skip("needs the trl extra", allow_module_level=True)


@pytest.mark.slow
def test_grpo_raises_the_reward_of_a_tiny_model_against_a_served_env(tmp_path: Path) -> None:
    from examples.bandit.train_grpo import png_size, train

    # 30 steps of 8 rollouts: ~25 s of CPU here. Everything is seeded (the model's
    # weights, sampling, the trainer), and the environment is deterministic. Measured
    # over four seeds: 0.12-0.23 over the first five steps, 2.70-2.98 over the last five.
    run = train(30, out=tmp_path, seed=0)
    assert len(run.rewards) == 30
    first, last = run.mean(0, 5), run.mean(25, 30)
    print(f"GRPO, 30 steps in {run.minutes:.1f} min: mean return {first:.2f} -> {last:.2f}")
    assert first < 1.0 and last - first > 1.0, run.rewards
    # Several pulls per rollout: the episode is played over turns (tool calls).
    assert sum(run.tool_calls[-5:]) / 5 >= 3
    assert png_size(tmp_path / "rewards.png") == (800, 480)
    saved = json.loads((tmp_path / "rewards.json").read_text())
    assert saved["rewards"] == run.rewards and saved["steps"] == 30
