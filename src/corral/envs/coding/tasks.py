"""The coding tasks: a function to write and the hidden cases that grade it.

Each :class:`Problem` asks for one Python function. Its :class:`TaskCase` list is hidden
from the agent: the arguments are sent into the sandbox only after the agent's code
ran, and the expected values never enter it. The sandbox reports each return value in
:func:`~corral.sandbox.canonical` form and :func:`matches` compares it with
the expected value here, in the parent process, so code in the sandbox cannot fake a
pass by overriding ``__eq__`` or patching the test runner.

Comparison follows Python's ``==`` with three deliberate differences: ``bool`` and ``int``
are different types (``1`` does not answer a yes/no question), floats compare with a
relative tolerance of 1e-9, and NaN never matches.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from corral.contract.tasks import Task
from corral.sandbox import canonical

SPLITS = ("train", "test")
"""The task splits; three of the ten shipped problems are held out for ``test``."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


@dataclasses.dataclass(frozen=True)
class TaskCase:
    """One hidden test: call the entry point with ``args``; it must return ``expected``.

    ``args`` and ``expected`` must be JSON data (None, bool, int, float, str, lists and
    dicts with string keys), because the arguments travel into the sandbox as JSON.
    """

    args: tuple[Any, ...]
    expected: Any

    def __post_init__(self) -> None:
        try:
            json.dumps([list(self.args), self.expected], allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"TaskCase args and expected must be JSON data, got args={self.args!r}, "
                f"expected={self.expected!r}: {exc}"
            ) from None


@dataclasses.dataclass(frozen=True)
class Problem:
    """A function for the agent to write.

    Attributes:
        name: short identifier used by the ``task`` reset option (lowercase, digits, ``-_``).
        signature: the function's ``def`` line, e.g. ``def fizzbuzz(n: int) -> str``.
        description: what the function must do.
        examples: a few visible examples, none of them a hidden case.
        cases: the hidden cases; the reward is the fraction that pass.
        split: the task split it belongs to (``train`` or ``test``).
    """

    name: str
    signature: str
    description: str
    examples: tuple[str, ...]
    cases: tuple[TaskCase, ...]
    split: str = "train"

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(
                f"Task.name must be lowercase letters, digits, '-' or '_', got {self.name!r}"
            )
        match = re.match(r"def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", self.signature)
        if match is None or not _IDENTIFIER.fullmatch(match.group(1)):
            raise ValueError(
                f"Task.signature must start with 'def <name>(', got {self.signature!r}"
            )
        if not self.cases:
            raise ValueError(f"task {self.name!r} has no hidden cases")
        if self.split not in SPLITS:
            raise ValueError(
                f"task {self.name!r}: split must be one of {SPLITS}, got {self.split!r}"
            )

    @property
    def entry_point(self) -> str:
        """The name of the function the hidden cases call."""
        match = re.match(r"def\s+([A-Za-z_][A-Za-z0-9_]*)", self.signature)
        assert match is not None  # checked in __post_init__
        return match.group(1)

    def prompt(self, persistent: bool) -> str:
        """The task statement shown to the agent at reset."""
        examples = "\n".join(f"    {line}" for line in self.examples)
        state_note = (
            "Variables and functions persist from one action to the next (one interpreter "
            "for the whole episode, restarted only if it dies)."
            if persistent
            else "Each action runs in a fresh interpreter: send the complete solution each time."
        )
        return (
            f"Task {self.name}: write this Python function.\n\n    {self.signature}\n\n"
            f"{self.description}\n\nExamples:\n{examples}\n\n"
            "Each action is Python source code, run in a sandbox (standard library only, no "
            f"network). After it runs, {len(self.cases)} hidden tests call "
            f"{self.entry_point}(); the reward is the fraction that pass, and the episode ends "
            f"when all of them do. {state_note}"
        )


def matches(expected: Any, actual: Any) -> bool:
    """True when ``actual`` (canonical form, from the sandbox) equals ``expected``."""
    try:
        return _same(canonical(expected), actual)
    except (TypeError, ValueError, IndexError, KeyError):
        return False  # a malformed report from the sandbox matches nothing


def _same(expected: list[Any], actual: Any) -> bool:
    if not isinstance(actual, list) or not actual or not isinstance(actual[0], str):
        return False
    kind, other = expected[0], actual[0]
    if kind in ("int", "float") and other in ("int", "float"):
        return _same_number(expected[1], actual[1])
    if kind != other or len(actual) != len(expected):
        return False
    if kind in ("list", "tuple"):
        items, candidates = expected[1], actual[1]
        return (
            isinstance(candidates, list)
            and len(items) == len(candidates)
            and all(_same(e, a) for e, a in zip(items, candidates, strict=True))
        )
    if kind in ("set", "frozenset", "dict"):
        return _same_unordered(expected[1], actual[1], pairs=kind == "dict")
    if kind == "none":
        return True
    if kind in ("str", "bool", "bytes"):
        return type(actual[1]) is type(expected[1]) and bool(actual[1] == expected[1])
    return False  # "other": not comparable data


def _same_number(expected: Any, actual: Any) -> bool:
    if isinstance(actual, bool) or not isinstance(actual, (int, float, str)):
        return False
    if isinstance(expected, str) or isinstance(actual, str):
        return bool(expected == actual and expected != "nan")  # "inf" / "-inf"
    if isinstance(expected, int) and isinstance(actual, int):
        return expected == actual
    return math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-12)


def _same_unordered(expected: list[Any], actual: Any, pairs: bool) -> bool:
    """Match every expected element (or key/value pair) with a distinct actual one."""
    if not isinstance(actual, list) or len(actual) != len(expected):
        return False
    unmatched = list(actual)
    for item in expected:
        for index, candidate in enumerate(unmatched):
            if pairs:
                found = (
                    isinstance(candidate, list)
                    and len(candidate) == 2
                    and _same(item[0], candidate[0])
                    and _same(item[1], candidate[1])
                )
            else:
                found = _same(item, candidate)
            if found:
                del unmatched[index]
                break
        else:
            return False
    return True


def _cases(pairs: Sequence[tuple[Any, Any]]) -> tuple[TaskCase, ...]:
    """Cases of one-argument functions from ``(argument, expected)`` pairs."""
    return tuple(TaskCase(args=(arg,), expected=expected) for arg, expected in pairs)


TASKS: tuple[Problem, ...] = (
    Problem(
        name="fizzbuzz",
        signature="def fizzbuzz(n: int) -> str",
        description=(
            'Return "FizzBuzz" if n is divisible by both 3 and 5, "Fizz" if only by 3, '
            '"Buzz" if only by 5, and otherwise n in decimal (str(n)).'
        ),
        examples=('fizzbuzz(12) == "Fizz"', 'fizzbuzz(20) == "Buzz"', 'fizzbuzz(8) == "8"'),
        cases=_cases(
            [
                (1, "1"),
                (2, "2"),
                (3, "Fizz"),
                (4, "4"),
                (5, "Buzz"),
                (6, "Fizz"),
                (9, "Fizz"),
                (10, "Buzz"),
                (15, "FizzBuzz"),
                (30, "FizzBuzz"),
                (45, "FizzBuzz"),
                (7, "7"),
                (98, "98"),
                (99, "Fizz"),
                (100, "Buzz"),
                (101, "101"),
            ]
        ),
    ),
    Problem(
        name="is_prime",
        signature="def is_prime(n: int) -> bool",
        description=(
            "Return True if n is a prime number and False otherwise (any int, including "
            "negative numbers, 0 and 1, which are not prime). It must be fast for n up to "
            "2**31."
        ),
        examples=("is_prime(13) is True", "is_prime(21) is False", "is_prime(-3) is False"),
        cases=_cases(
            [
                (-7, False),
                (0, False),
                (1, False),
                (2, True),
                (3, True),
                (4, False),
                (5, True),
                (9, False),
                (15, False),
                (17, True),
                (25, False),
                (97, True),
                (100, False),
                (7919, True),
                (7917, False),
                (1000003, True),
                (1000001, False),
                (2147483647, True),
            ]
        ),
    ),
    Problem(
        name="fibonacci",
        signature="def fibonacci(n: int) -> int",
        description=(
            "Return the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1, "
            "as an exact int (n is at most 1000)."
        ),
        examples=("fibonacci(5) == 5", "fibonacci(7) == 13", "fibonacci(12) == 144"),
        cases=_cases(
            [
                (0, 0),
                (1, 1),
                (2, 1),
                (3, 2),
                (10, 55),
                (20, 6765),
                (50, 12586269025),
                (90, 2880067194370816120),
                (100, 354224848179261915075),
            ]
        ),
    ),
    Problem(
        name="reverse_words",
        signature="def reverse_words(s: str) -> str",
        description=(
            "Return the words of s (runs of non-whitespace) in reverse order, joined by "
            "single spaces, without leading or trailing whitespace."
        ),
        examples=(
            'reverse_words("a b c") == "c b a"',
            'reverse_words("  hi  there ") == "there hi"',
        ),
        cases=_cases(
            [
                ("hello world", "world hello"),
                ("one", "one"),
                ("", ""),
                ("  leading and trailing  ", "trailing and leading"),
                ("a  b   c", "c b a"),
                ("The quick brown fox", "fox brown quick The"),
            ]
        ),
    ),
    Problem(
        name="is_palindrome",
        signature="def is_palindrome(s: str) -> bool",
        description=(
            "Return True if s reads the same forwards and backwards when only its "
            "alphanumeric characters are kept and case is ignored."
        ),
        examples=('is_palindrome("Step on no pets") is True', 'is_palindrome("abc") is False'),
        cases=_cases(
            [
                ("A man, a plan, a canal: Panama", True),
                ("race a car", False),
                ("", True),
                ("a", True),
                ("No 'x' in Nixon", True),
                ("ab", False),
                ("Was it a car or a cat I saw?", True),
                ("0P", False),
            ]
        ),
    ),
    Problem(
        name="roman_to_int",
        split="test",
        signature="def roman_to_int(s: str) -> int",
        description=(
            "Convert a valid Roman numeral (I, V, X, L, C, D, M, with subtractive pairs such "
            "as IV and CM) between 1 and 3999 to an int."
        ),
        examples=('roman_to_int("VI") == 6', 'roman_to_int("XIV") == 14'),
        cases=_cases(
            [
                ("I", 1),
                ("III", 3),
                ("IV", 4),
                ("IX", 9),
                ("LVIII", 58),
                ("XL", 40),
                ("XC", 90),
                ("CD", 400),
                ("CM", 900),
                ("MCMXCIV", 1994),
                ("MMXXIV", 2024),
                ("CDXLIV", 444),
                ("MMMCMXCIX", 3999),
            ]
        ),
    ),
    Problem(
        name="run_length_encode",
        split="test",
        signature="def run_length_encode(s: str) -> str",
        description=(
            "Replace each run of equal characters by the character followed by the run's "
            "length in decimal."
        ),
        examples=('run_length_encode("aab") == "a2b1"', 'run_length_encode("xyz") == "x1y1z1"'),
        cases=_cases(
            [
                ("", ""),
                ("a", "a1"),
                ("aaabccdddd", "a3b1c2d4"),
                ("abc", "a1b1c1"),
                ("zzzzzzzzzzzz", "z12"),
                ("aabbaa", "a2b2a2"),
                ("  ", " 2"),
            ]
        ),
    ),
    Problem(
        name="word_count",
        signature="def word_count(text: str) -> dict[str, int]",
        description=(
            "Count the words of text: a word is a maximal run of ASCII letters (A-Z, a-z), "
            "compared case-insensitively and returned in lowercase. Return a dict from word "
            "to count."
        ),
        examples=('word_count("A a b") == {"a": 2, "b": 1}', 'word_count("Go, go!") == {"go": 2}'),
        cases=_cases(
            [
                ("", {}),
                ("the cat and the hat", {"the": 2, "cat": 1, "and": 1, "hat": 1}),
                ("Hello, hello! HELLO?", {"hello": 3}),
                ("one-two three_four", {"one": 1, "two": 1, "three": 1, "four": 1}),
                ("It's 2024: it is.", {"it": 2, "s": 1, "is": 1}),
            ]
        ),
    ),
    Problem(
        name="flatten",
        split="test",
        signature="def flatten(nested: list) -> list",
        description=(
            "Return the non-list items of an arbitrarily nested list, in order, as one flat list."
        ),
        examples=("flatten([1, [2, 3]]) == [1, 2, 3]", "flatten([[], [[]]]) == []"),
        cases=_cases(
            [
                ([], []),
                ([1, 2, 3], [1, 2, 3]),
                ([1, [2, [3, [4]], 5]], [1, 2, 3, 4, 5]),
                ([[[[]]]], []),
                ([["a"], ["b", ["c"]]], ["a", "b", "c"]),
                ([[1, 2], [], [3, [4, [5, [6]]]]], [1, 2, 3, 4, 5, 6]),
            ]
        ),
    ),
    Problem(
        name="primes_up_to",
        signature="def primes_up_to(n: int) -> list[int]",
        description="Return the list of all primes p with p <= n, in increasing order.",
        examples=("primes_up_to(5) == [2, 3, 5]", "primes_up_to(-3) == []"),
        cases=_cases(
            [
                (0, []),
                (1, []),
                (2, [2]),
                (10, [2, 3, 5, 7]),
                (30, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]),
                (100, [p for p in range(2, 101) if all(p % d for d in range(2, p))]),
            ]
        ),
    ),
)
"""The shipped tasks, in a fixed order (seeds index into it)."""


class CodingTask(Task):
    """A coding problem as the task API publishes it: the statement, not the hidden tests.

    Attributes:
        name: the problem's name (also the ``task`` reset option).
        signature: the function's ``def`` line.
        description: what the function must do.
        examples: the visible examples.
        tests: how many hidden tests grade it.
    """

    name: str
    signature: str
    description: str
    examples: list[str]
    tests: int

    @classmethod
    def of(cls, problem: Problem, index: int) -> CodingTask:
        """The published form of ``problem``, task ``index`` of its split."""
        return cls(
            split=problem.split,
            index=index,
            id=problem.name,
            name=problem.name,
            signature=problem.signature,
            description=problem.description,
            examples=list(problem.examples),
            tests=len(problem.cases),
        )
