"""A ten-lever bandit played in turns: the multi-turn environment the GRPO example trains
a language model on.

Each episode is ``pulls`` turns (3 by default); each turn the agent pulls one lever,
0 to 9, and the ``paying`` lever (7 by default; a reset option) pays 1, the others 0. The
episode's return is how many pulls paid: easy to learn (always pull the paying lever)
and dense enough that a tiny model from random weights shows the rise within a minute
or two of CPU, which is what the example and its test need.

    corral serve examples/bandit             # corral.yaml names BanditEnv
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from corral.contract import Action, Environment, Observation, State


class LeverAction(Action):
    """Pull one lever."""

    lever: int = Field(ge=0, le=9, description="The lever to pull, 0 to 9.")


class BanditObservation(Observation):
    """What the last pull paid and how many pulls are left."""

    payout: float = Field(default=0.0, description="What the last pull paid (0 or 1).")
    pulls_left: int = Field(default=0, ge=0, description="Pulls left in this episode.")


class BanditOptions(BaseModel):
    """The reset options: which lever pays, and how many pulls an episode has."""

    paying: int = Field(default=7, ge=0, le=9, description="The lever that pays.")
    pulls: int = Field(default=3, ge=1, le=100, description="Pulls per episode.")


class BanditState(State):
    """The episode so far."""

    paying: int = 7
    paid: float = 0.0


class BanditEnv(Environment[LeverAction, BanditObservation, BanditState]):
    """Ten levers, one of which pays 1 per pull; ``pulls`` pulls per episode."""

    name = "bandit"
    description = (
        "A ten-lever bandit: pull a lever (0 to 9) each turn; one lever pays 1, the others "
        "nothing. Each episode has a few pulls; the return is how many paid."
    )

    reset_options_type = BanditOptions

    def __init__(self) -> None:
        self._state = BanditState()
        self.pulls = 3

    def reset(self, seed: int | None = None, **options: object) -> BanditObservation:
        chosen = BanditOptions.model_validate(options)  # the server checked them already
        self._state = BanditState(paying=chosen.paying)
        self.pulls = chosen.pulls
        return BanditObservation(pulls_left=chosen.pulls)

    def step(self, action: LeverAction) -> BanditObservation:
        state = self._state
        state.step_count += 1
        payout = 1.0 if action.lever == state.paying else 0.0
        state.paid += payout
        left = self.pulls - state.step_count
        return BanditObservation(payout=payout, pulls_left=left, reward=payout, done=left <= 0)

    def state(self) -> BanditState:
        return self._state
