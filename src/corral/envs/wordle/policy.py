"""A small, dependency-free Wordle player for demos and tests.

:class:`SimplePolicy` keeps the words consistent with every pattern seen so far (a word is
consistent when, had it been the secret, each past guess would have scored exactly as it
did) and guesses one of them. Among the candidates it prefers words whose distinct letters
are common among the remaining candidates, choosing at random among the ``top`` best so
that the seed matters; this solves the vast majority of games within six guesses.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Iterable

from corral.envs.wordle.game import consistent_words, load_words, parse_word_list
from corral.envs.wordle.models import WordleAction, WordleObservation


class SimplePolicy:
    """Guess a word consistent with all feedback so far.

    Use :meth:`act` with each observation of an episode (it notices a new episode by its
    history), or drive it by hand with :meth:`observe` and :meth:`next_guess`.

    Args:
        words: the words it may guess (default: the shipped list). It can only solve a
            secret that is in this list.
        seed: seeds the choice among the best candidates; ``None`` draws fresh entropy.
        top: how many of the best-ranked candidates to choose among (1: always the best).

    Raises:
        ValueError: if ``words`` holds a non-word or nothing, or ``top`` is below 1.
    """

    def __init__(
        self, words: Iterable[str] | None = None, seed: int | None = None, top: int = 3
    ) -> None:
        if top < 1:
            raise ValueError(f"top must be at least 1, got {top}")
        self._words = load_words() if words is None else parse_word_list(words, source="words")
        self._top = top
        self._rng = random.Random(seed)
        self._candidates: tuple[str, ...] = self._words
        self._seen: list[tuple[str, str]] = []

    @property
    def candidates(self) -> tuple[str, ...]:
        """The words still consistent with every pattern observed this episode."""
        return self._candidates

    def reset(self, seed: int | None = None) -> None:
        """Forget the episode's feedback; reseed the choice when ``seed`` is given."""
        self._candidates = self._words
        self._seen = []
        if seed is not None:
            self._rng.seed(seed)

    def observe(self, guess: str, pattern: str) -> None:
        """Narrow the candidates with one scored guess (``pattern`` like ``"GY..G"``).

        Raises:
            ValueError: if ``guess`` is not a 5-letter word or ``pattern`` not 5 marks.
        """
        guess = guess.lower()
        self._candidates = consistent_words(self._candidates, guess, pattern)
        self._seen.append((guess, pattern))

    def next_guess(self) -> str:
        """The next word to guess.

        When the feedback rules out every known word (the secret is not in this policy's
        list), it falls back to any word it has not guessed yet.
        """
        guessed = {guess for guess, _ in self._seen}
        pool = self._candidates or tuple(w for w in self._words if w not in guessed)
        return self._rng.choice(_ranked(pool or self._words)[: self._top])

    def act(self, observation: WordleObservation) -> WordleAction:
        """Update from ``observation``'s history and return the next guess.

        A history that does not extend the one seen before means a new episode, and the
        candidates start over.
        """
        history = [(record.guess, record.pattern) for record in observation.history]
        if history[: len(self._seen)] != self._seen:
            self.reset()
        for guess, pattern in history[len(self._seen) :]:
            self.observe(guess, pattern)
        return WordleAction(guess=self.next_guess())


@functools.lru_cache(maxsize=4)
def _ranked(pool: tuple[str, ...]) -> tuple[str, ...]:
    """``pool`` best first: by how many words of the pool share each distinct letter.

    Cached because every episode starts from the same full list.
    """
    letter_counts: Counter[str] = Counter()
    for word in pool:
        letter_counts.update(set(word))
    return tuple(sorted(pool, key=lambda w: (-sum(letter_counts[c] for c in set(w)), w)))
