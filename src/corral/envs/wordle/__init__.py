"""Wordle: corral's built-in text game (guess a 5-letter word from per-letter feedback).

from corral.envs.wordle import WordleEnv, WordleAction, SimplePolicy

env = WordleEnv()
obs = env.reset(seed=7)
policy = SimplePolicy(seed=7)
while not obs.done:
    obs = env.step(policy.act(obs))
"""

from corral.envs.wordle.env import WordleEnv
from corral.envs.wordle.game import LetterScore, load_words, score_guess
from corral.envs.wordle.models import (
    GuessRecord,
    WordleAction,
    WordleObservation,
    WordleSnapshot,
    WordleState,
    WordleTask,
)
from corral.envs.wordle.policy import SimplePolicy

__all__ = [
    "GuessRecord",
    "LetterScore",
    "SimplePolicy",
    "WordleAction",
    "WordleEnv",
    "WordleObservation",
    "WordleSnapshot",
    "WordleState",
    "WordleTask",
    "load_words",
    "score_guess",
]
