"""Wordle's rules as plain functions: the shipped word list and per-letter scoring.

Kept free of pydantic and of the environment so the policy helper, the environment and
tests all share one implementation of the scoring rule.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from importlib import resources
from typing import Literal

WORD_LENGTH = 5
"""Length of every secret and every guess."""

CORRECT = "G"
"""Pattern mark: the right letter in the right spot (green)."""
PRESENT = "Y"
"""Pattern mark: the letter is in the word, in another spot (yellow)."""
ABSENT = "."
"""Pattern mark: the letter is not in the word, or not that many times (gray)."""

LetterScore = Literal["correct", "present", "absent"]
"""The spelled-out form of one pattern mark."""

MARK_NAMES: dict[str, LetterScore] = {CORRECT: "correct", PRESENT: "present", ABSENT: "absent"}
"""Pattern mark → spelled-out score."""

_WORD_RE = re.compile(r"[a-z]{5}")
_PACKAGE = "corral.envs.wordle"
_WORDS_FILE = "words.txt"


def is_word_shaped(text: str) -> bool:
    """True when ``text`` is exactly five lowercase ASCII letters."""
    return _WORD_RE.fullmatch(text) is not None


def score_guess(guess: str, secret: str) -> str:
    """Score ``guess`` against ``secret`` exactly as Wordle does; return a pattern.

    The pattern has one mark per letter: ``G`` (right spot), ``Y`` (elsewhere in the word)
    or ``.`` (not in the word). Repeated letters follow Wordle's rule: greens are matched
    first, then the remaining copies of each letter in the secret are handed out as yellows
    from left to right; a guessed copy beyond the secret's count is ``.``.

    Raises:
        ValueError: if either word is not five lowercase ASCII letters.
    """
    for role, word in (("guess", guess), ("secret", secret)):
        if not is_word_shaped(word):
            raise ValueError(f"{role} must be 5 lowercase ASCII letters, got {word!r}")
    return _score(guess, secret)


def consistent_words(words: Iterable[str], guess: str, pattern: str) -> tuple[str, ...]:
    """The words that, had one been the secret, would have scored ``guess`` as ``pattern``.

    Raises:
        ValueError: if ``guess`` is not five lowercase ASCII letters or ``pattern`` is not
            five marks; a word of ``words`` that is not word-shaped is never consistent.
    """
    if not is_word_shaped(guess):
        raise ValueError(f"guess must be 5 lowercase ASCII letters, got {guess!r}")
    pattern_scores(pattern)
    return tuple(w for w in words if is_word_shaped(w) and _score(guess, w) == pattern)


def _score(guess: str, secret: str) -> str:
    """:func:`score_guess` without the argument checks, for the policy's hot loop."""
    marks = [ABSENT] * WORD_LENGTH
    unmatched: dict[str, int] = {}
    for i in range(WORD_LENGTH):
        letter = secret[i]
        if guess[i] == letter:
            marks[i] = CORRECT
        else:
            unmatched[letter] = unmatched.get(letter, 0) + 1
    for i in range(WORD_LENGTH):
        if marks[i] == ABSENT:
            left = unmatched.get(guess[i], 0)
            if left:
                marks[i] = PRESENT
                unmatched[guess[i]] = left - 1
    return "".join(marks)


def pattern_scores(pattern: str) -> list[LetterScore]:
    """Spell out a pattern such as ``"GY..G"`` as ``["correct", "present", ...]``.

    Raises:
        ValueError: if ``pattern`` is not five marks from ``G``, ``Y`` and ``.``.
    """
    if len(pattern) != WORD_LENGTH or any(mark not in MARK_NAMES for mark in pattern):
        raise ValueError(f"a pattern is 5 marks from 'G', 'Y' and '.', got {pattern!r}")
    return [MARK_NAMES[mark] for mark in pattern]


def parse_word_list(lines: Iterable[str], source: str = "word list") -> tuple[str, ...]:
    """Read a word list: one word a line, ``#`` comments and blank lines ignored.

    Words are lowercased and deduplicated; the result is sorted so that a seed selects the
    same secret regardless of the order the list was written in.

    Raises:
        ValueError: naming the first line that is not a 5-letter word, or if the list is empty.
    """
    words: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word = line.lower()
        if not is_word_shaped(word):
            raise ValueError(
                f"{source} line {number}: {line!r} is not a 5-letter word of ASCII letters"
            )
        words.add(word)
    if not words:
        raise ValueError(f"{source} contains no words")
    return tuple(sorted(words))


SPLITS = ("train", "test")
"""The task splits of a word list."""
TEST_SHARE = 5
"""One word in about this many is in the test split."""


def split_of(word: str) -> str:
    """The split ``word`` belongs to: ``test`` for about one word in :data:`TEST_SHARE`.

    Decided by a hash of the word alone, so adding words to a list never moves another
    word from one split to the other.
    """
    return "test" if hashlib.sha256(word.encode()).digest()[0] % TEST_SHARE == 0 else "train"


def split_words(words: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``{"train": ..., "test": ...}``: each split's words, sorted."""
    chosen: dict[str, list[str]] = {name: [] for name in SPLITS}
    for word in sorted(words):
        chosen[split_of(word)].append(word)
    return {name: tuple(group) for name, group in chosen.items()}


@functools.cache
def load_words() -> tuple[str, ...]:
    """The shipped word list (sorted, lowercase), read once from the package data."""
    text = resources.files(_PACKAGE).joinpath(_WORDS_FILE).read_text(encoding="utf-8")
    return parse_word_list(text.splitlines(), source=f"{_PACKAGE}/{_WORDS_FILE}")
