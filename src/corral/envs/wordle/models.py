"""The Wordle environment's wire models: the guess, the observation, the task, the state
and the snapshot.

Apart from :mod:`corral.envs.wordle.env` so that the scripted policy (which builds actions
from observations) and the environment (which ships the policy) both import them.
"""

from __future__ import annotations

import re

from pydantic import ConfigDict, Field, field_validator

from corral.contract import Action, Observation, Snapshot, State, WireModel
from corral.contract.tasks import Task
from corral.envs.wordle.game import LetterScore

DEFAULT_MAX_GUESSES = 6
DEFAULT_MAX_TURNS = 20

_GUESS_RE = re.compile(r"[A-Za-z]{5}")


class WordleAction(Action):
    """One guess: exactly five ASCII letters in any case, normalised to lowercase."""

    guess: str = Field(
        description="Five ASCII letters (any case); lowercased before scoring.",
        json_schema_extra={"pattern": "^[A-Za-z]{5}$"},
        examples=["crane"],
    )

    @field_validator("guess")
    @classmethod
    def _five_letters(cls, value: str) -> str:
        if _GUESS_RE.fullmatch(value) is None:
            raise ValueError(
                f"guess must be exactly 5 ASCII letters (a-z, any case), got {value!r} "
                f"({len(value)} characters)"
            )
        return value.lower()


class GuessRecord(WireModel):
    """One accepted guess and its pattern (``G`` right spot, ``Y`` elsewhere, ``.`` absent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    guess: str
    pattern: str


class WordleObservation(Observation):
    """What the player sees after ``reset`` or a guess.

    Attributes:
        guess: the word this step submitted (``""`` after reset).
        accepted: the word was in the list and used a guess.
        pattern: the guess's marks, e.g. ``"GY..G"`` (``""`` when nothing was scored).
        feedback: the same marks spelled out, one per letter.
        history: every accepted guess of the episode with its pattern, oldest first.
        guesses_left: guesses still available.
        turns_left: steps left before truncation, or ``None`` without a turn limit.
        message: a short human-readable account of the step.
        secret: the secret word, revealed only once the episode is over.
    """

    guess: str = ""
    accepted: bool = False
    pattern: str = ""
    feedback: list[LetterScore] = Field(default_factory=list)
    history: list[GuessRecord] = Field(default_factory=list)
    guesses_left: int = 0
    turns_left: int | None = None
    message: str = ""
    secret: str | None = None


class WordleTask(Task):
    """One Wordle task: the secret word of position ``index`` in its split."""

    word: str


class WordleState(State):
    """The game as a trainer may inspect it, secret included.

    ``step_count`` counts every step, rejected words included (the turn counter).

    Attributes:
        secret: the word to guess (``None`` before the first reset).
        max_guesses: guesses allowed this episode.
        max_turns: steps allowed before truncation, or ``None`` for no limit.
        guesses: accepted guesses, oldest first.
        guesses_made: ``len(guesses)``.
        rejected: how many submitted words were not in the list.
        solved: the secret was guessed.
        done: the episode is over (solved, out of guesses, or truncated).
        seed: the seed the episode was reset with.
        task: the id of the task it plays (``test-12``), when reset with one.
    """

    secret: str | None = None
    max_guesses: int = DEFAULT_MAX_GUESSES
    max_turns: int | None = DEFAULT_MAX_TURNS
    guesses: list[str] = Field(default_factory=list)
    guesses_made: int = 0
    rejected: int = 0
    solved: bool = False
    done: bool = False
    seed: int | None = None
    task: str | None = None


class WordleSnapshot(Snapshot):
    """A Wordle session, secret included: its state, the accepted guesses with their
    patterns, and the observation it returned last. It reveals the secret: a trainer
    must never show it to the policy."""

    state: WordleState
    history: list[GuessRecord] = Field(default_factory=list)
    last: WordleObservation | None = None
