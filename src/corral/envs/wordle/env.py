"""A Wordle-style word-guessing game as a corral environment.

The secret is a 5-letter word drawn from the shipped list (:func:`load_words`) by
``random.Random(seed)``, so one seed always gives the same secret and, for the same
guesses, the same observations. Each guess gets one mark per letter: ``G`` (right spot),
``Y`` (elsewhere in the word), ``.`` (not in the word, or no more copies of it).

Rewards (shaped so a simple policy has something to climb):

* solving: ``1.0 + 0.1 * guesses_left`` (so fewer guesses pay more);
* any other accepted guess: ``0.1`` per position that turns green for the first time in
  the episode, plus ``0.05`` per letter marked green or yellow for the first time;
* a word that is not in the list: ``0.0``; it does not use a guess and ``message`` says so.

Each step's ``reward_components`` splits its reward into ``solve``, or ``new_greens`` and
``new_letters``.

The episode *terminates* (``done=True, truncated=False``) when the word is solved or the
guesses run out; it is *truncated* (``done=True, truncated=True``) when ``max_turns`` steps
(rejected words included) have been taken without either. The secret appears in the
observation only once the episode is over.

Reset options: ``max_guesses`` (int >= 1, default 6), ``max_turns`` (int >= 1 or ``None``
for no limit, default 20), ``word`` (force the secret; must be in the list),
``split`` and ``index`` (play task ``index`` of split ``train`` or ``test``) and
``episode_id`` (str).

Tasks: the word list is split into ``train`` (about four words in five) and ``test`` by a
hash of each word (:func:`~corral.envs.wordle.game.split_of`); task ``i`` of a split is
its ``i``-th word in alphabetical order (:class:`WordleTask`). ``reset(seed=...)`` alone
still draws from the whole list. The final observation's ``metadata["success"]`` says
whether the word was found.

Sessions can be snapshotted and restored (:class:`~corral.envs.wordle.models.WordleSnapshot`:
the state, secret included, the guesses and the last observation); a snapshot whose secret
is not in this server's word list is refused (``BAD_SNAPSHOT``).
"""

from __future__ import annotations

import html
import random
import uuid
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from corral.contract import Environment
from corral.contract.options import parse_reset_options
from corral.contract.tasks import Task, resolve_task, task_ref
from corral.envs.wordle.game import (
    CORRECT,
    PRESENT,
    SPLITS,
    WORD_LENGTH,
    load_words,
    parse_word_list,
    pattern_scores,
    score_guess,
    split_words,
)
from corral.envs.wordle.models import (
    DEFAULT_MAX_GUESSES,
    DEFAULT_MAX_TURNS,
    GuessRecord,
    WordleAction,
    WordleObservation,
    WordleSnapshot,
    WordleState,
    WordleTask,
)
from corral.envs.wordle.policy import SimplePolicy
from corral.errors import BadSnapshot, InvalidArgument

SOLVE_REWARD = 1.0
"""Reward for the guess that solves the word, before the bonus."""
SOLVE_BONUS_PER_GUESS_LEFT = 0.1
"""Extra reward on solving, per guess still unused."""
NEW_GREEN_REWARD = 0.1
"""Reward per position that turns green for the first time in the episode."""
NEW_LETTER_REWARD = 0.05
"""Reward per letter marked green or yellow for the first time in the episode."""

MAX_GUESSES_LIMIT = 100
"""Upper bound on ``max_guesses``; more would make the game meaningless."""

_SOLVED_PATTERN = CORRECT * WORD_LENGTH
_OPTIONS_HELP = (
    f"max_guesses (int 1..{MAX_GUESSES_LIMIT}, default {DEFAULT_MAX_GUESSES}), "
    f"max_turns (int >= 1, or None for no limit; default {DEFAULT_MAX_TURNS}), "
    "word (a word from the list, to force the secret), split (train or test) with "
    "index (int >= 0, the task), episode_id (str)"
)


_StrictPositive = Annotated[int, Field(strict=True, ge=1)]


class _ResetOptions(BaseModel):
    """Validates ``reset`` options so a typo or bad value fails loudly."""

    model_config = ConfigDict(extra="forbid")

    max_guesses: Annotated[int, Field(strict=True, ge=1, le=MAX_GUESSES_LIMIT)]
    max_turns: _StrictPositive | None
    word: str | None = None
    split: str | None = None
    index: int | None = Field(default=None, strict=True)
    episode_id: str | None = None


def _parse_options(values: dict[str, Any]) -> _ResetOptions:
    return parse_reset_options(_ResetOptions, values, env="wordle", accepted=_OPTIONS_HELP)


class WordleEnv(Environment[WordleAction, WordleObservation, WordleState]):
    """Guess the secret 5-letter word within ``max_guesses`` guesses.

    Args:
        words: the word list to use instead of the shipped one (each a 5-letter word);
            every word is both a possible secret and an allowed guess.
        max_guesses: default for the ``max_guesses`` reset option.
        max_turns: default for the ``max_turns`` reset option (``None``: no limit).

    Raises:
        ValueError: if ``words`` holds a non-word or nothing, or a default is out of range.
    """

    name = "wordle"
    description = (
        "Wordle: guess the secret 5-letter word (6 guesses by default). Each guess is marked "
        "per letter G (right spot), Y (in the word elsewhere) or . (absent). Reward 1 + 0.1 "
        "per unused guess on solving, small rewards for new greens/yellows; a word not in "
        "the list costs a turn but not a guess."
    )
    contract_version = "1.0.0"
    task_type = WordleTask

    def __init__(
        self,
        words: Iterable[str] | None = None,
        *,
        max_guesses: int = DEFAULT_MAX_GUESSES,
        max_turns: int | None = DEFAULT_MAX_TURNS,
    ) -> None:
        self._words = load_words() if words is None else parse_word_list(words, source="words")
        self._allowed = frozenset(self._words)
        self._splits = split_words(self._words)
        defaults = _parse_options({"max_guesses": max_guesses, "max_turns": max_turns})
        self._max_guesses = defaults.max_guesses
        self._max_turns = defaults.max_turns
        self._state = WordleState()
        self._history: list[GuessRecord] = []
        self._last: WordleObservation | None = None

    @property
    def words(self) -> tuple[str, ...]:
        """The sorted word list: the possible secrets and the allowed guesses."""
        return self._words

    def reset(self, seed: int | None = None, **options: Any) -> WordleObservation:
        """Draw a secret from ``seed`` (or use ``options["word"]``) and start an episode.

        Raises:
            ValueError: for an unknown option, a value out of range, or a ``word`` that is
                not in the list.
        """
        opts = _parse_options(
            {"max_guesses": self._max_guesses, "max_turns": self._max_turns, **options}
        )
        ref = task_ref(opts.split, opts.index)
        task: Task | None = None
        if ref is not None:
            if opts.word is not None:
                raise InvalidArgument(
                    "reset options word and split/index both choose the secret; pass one"
                )
            task = resolve_task(self, ref.split, ref.index)
        if isinstance(task, WordleTask):
            secret = task.word
        elif opts.word is None:
            secret = random.Random(seed).choice(self._words)
        else:
            secret = opts.word.lower()
            if secret not in self._allowed:
                raise InvalidArgument(
                    f"reset option word={opts.word!r} is not in the word list "
                    f"({len(self._words)} words); pass one of WordleEnv().words or omit "
                    "`word` to draw the secret from the seed"
                )
        self._state = WordleState(
            episode_id=opts.episode_id or str(uuid.uuid4()),
            secret=secret,
            max_guesses=opts.max_guesses,
            max_turns=opts.max_turns,
            seed=seed,
            task=task.id if task is not None else None,
        )
        self._history = []
        self._last = WordleObservation(
            guesses_left=opts.max_guesses,
            turns_left=opts.max_turns,
            message=(
                f"Guess the 5-letter word in {opts.max_guesses} guesses. Each letter is marked "
                "G (right spot), Y (in the word, elsewhere) or . (not in the word)."
            ),
        )
        return self._last

    @classmethod
    def scripted_policy(cls, seed: int | None) -> Callable[[Any], Any]:
        """:class:`~corral.envs.wordle.SimplePolicy`'s ``act``, seeded."""
        return SimplePolicy(seed=seed).act

    def splits(self) -> list[str]:
        """``["train", "test"]``."""
        return list(SPLITS)

    def num_tasks(self, split: str) -> int:
        """The number of words in ``split``."""
        return len(self._splits[split])

    def task(self, split: str, index: int) -> WordleTask:
        """The ``index``-th word (alphabetical) of ``split``."""
        return WordleTask(split=split, index=index, word=self._splits[split][index])

    def step(self, action: WordleAction) -> WordleObservation:
        """Score one guess, or reject a word that is not in the list.

        Raises:
            RuntimeError: before the first ``reset`` or after the episode ended.
        """
        state = self._state
        if state.secret is None:
            raise RuntimeError("wordle: call reset() before step()")
        if state.done:
            raise RuntimeError("wordle: the episode is over; call reset() to start a new one")
        state.step_count += 1
        guess = action.guess
        pattern = ""
        if guess in self._allowed:
            pattern = score_guess(guess, state.secret)
            components = self._reward(guess, pattern)
            self._history.append(GuessRecord(guess=guess, pattern=pattern))
            state.guesses.append(guess)
            state.guesses_made += 1
            state.solved = pattern == _SOLVED_PATTERN
        else:
            components = {}
            state.rejected += 1
        guesses_left = state.max_guesses - state.guesses_made
        terminated = state.solved or guesses_left == 0
        truncated = (
            not terminated and state.max_turns is not None and state.step_count >= state.max_turns
        )
        state.done = terminated or truncated
        self._last = WordleObservation(
            guess=guess,
            accepted=bool(pattern),
            pattern=pattern,
            feedback=pattern_scores(pattern) if pattern else [],
            history=list(self._history),
            guesses_left=guesses_left,
            turns_left=None if state.max_turns is None else state.max_turns - state.step_count,
            message=self._message(guess, pattern, guesses_left, truncated),
            secret=state.secret if state.done else None,
            reward=round(sum(components.values()), 6),
            reward_components=components,
            done=state.done,
            truncated=truncated,
            metadata={"success": state.solved} if state.done else {},
        )
        return self._last

    def state(self) -> WordleState:
        """A copy of the current state, secret included."""
        return self._state.model_copy(deep=True)

    def snapshot(self) -> WordleSnapshot:
        """The whole game, secret included (see :class:`WordleSnapshot`)."""
        return WordleSnapshot(state=self.state(), history=list(self._history), last=self._last)

    def restore(self, snapshot: WordleSnapshot) -> WordleObservation:
        """Continue the game ``snapshot`` captured.

        Raises:
            BadSnapshot: its secret or a guess is not in this server's word list.
        """
        state = snapshot.state
        unknown = [
            w for w in (state.secret, *state.guesses) if w is not None and w not in self._allowed
        ]
        if unknown:
            raise BadSnapshot(
                f"the snapshot's words {unknown[:3]} are not in this server's word list "
                f"({len(self._words)} words): it was taken by a Wordle with other words",
                details={"unknown": unknown[:3]},
            )
        self._state = state.model_copy(deep=True)
        self._history = list(snapshot.history)
        self._last = snapshot.last
        if snapshot.last is None:
            return WordleObservation()
        return snapshot.last.model_copy(deep=True)

    def render_html(self, observation: WordleObservation) -> str:
        """The board for the web UI: one row of coloured tiles per accepted guess."""
        colour = {CORRECT: "#6aaa64", PRESENT: "#c9b458"}
        rows = []
        for record in observation.history:
            tiles = "".join(
                f'<span style="background:{colour.get(mark, "#787c7e")}">{html.escape(letter)}'
                "</span>"
                for letter, mark in zip(record.guess.upper(), record.pattern, strict=True)
            )
            rows.append(f'<div class="row">{tiles}</div>')
        left = max(observation.guesses_left, 0)
        rows.extend(['<div class="row">' + "<span></span>" * WORD_LENGTH + "</div>"] * left)
        return (
            "<style>body{font:600 22px system-ui,sans-serif;margin:8px;color:#fff}"
            ".row{display:flex;gap:5px;margin-bottom:5px}"
            ".row span{width:44px;height:44px;display:flex;align-items:center;"
            "justify-content:center;border:2px solid #d3d6da}"
            "p{color:#333;font-size:14px;font-weight:400}</style>"
            + "".join(rows)
            + f"<p>{html.escape(observation.message)}</p>"
        )

    def web_actions(self, observation: WordleObservation) -> list[tuple[str, WordleAction]]:
        """Up to three words consistent with the board so far (the simple policy's pick
        first), as one-click guesses."""
        if observation.done:
            return []
        from corral.envs.wordle.policy import SimplePolicy  # the policy imports this module

        policy = SimplePolicy(self._words, seed=0, top=1)
        for record in observation.history:
            policy.observe(record.guess, record.pattern)
        best = policy.next_guess()
        picks = [best, *[word for word in policy.candidates if word != best][:2]]
        return [(f"try {word}", WordleAction(guess=word)) for word in picks]

    def _reward(self, guess: str, pattern: str) -> dict[str, float]:
        """The reward components of an accepted guess, given the guesses before it."""
        if pattern == _SOLVED_PATTERN:
            guesses_left = self._state.max_guesses - self._state.guesses_made - 1
            return {"solve": round(SOLVE_REWARD + SOLVE_BONUS_PER_GUESS_LEFT * guesses_left, 6)}
        known_greens = {
            i
            for record in self._history
            for i, mark in enumerate(record.pattern)
            if mark == CORRECT
        }
        known_letters = {
            letter
            for record in self._history
            for letter, mark in zip(record.guess, record.pattern, strict=True)
            if mark in (CORRECT, PRESENT)
        }
        new_greens = {i for i, mark in enumerate(pattern) if mark == CORRECT} - known_greens
        new_letters = {
            letter
            for letter, mark in zip(guess, pattern, strict=True)
            if mark in (CORRECT, PRESENT)
        } - known_letters
        return {
            "new_greens": round(NEW_GREEN_REWARD * len(new_greens), 6),
            "new_letters": round(NEW_LETTER_REWARD * len(new_letters), 6),
        }

    def _message(self, guess: str, pattern: str, guesses_left: int, truncated: bool) -> str:
        state = self._state
        if state.solved:
            n = state.guesses_made
            return f"{guess} {pattern}: solved in {n} guess{'es' if n != 1 else ''}!"
        plural = "es" if guesses_left != 1 else ""
        if pattern:
            text = f"{guess} {pattern}: {guesses_left} guess{plural} left."
        else:
            text = (
                f"{guess!r} is not in the word list, so it did not use a guess; "
                f"{guesses_left} guess{plural} left."
            )
        if guesses_left == 0:
            text += f" Out of guesses: the word was {state.secret!r}."
        elif truncated:
            text += f" Turn limit ({state.max_turns}) reached: the word was {state.secret!r}."
        return text
