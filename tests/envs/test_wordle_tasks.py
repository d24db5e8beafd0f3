"""Wordle's word list as train/test tasks."""

from __future__ import annotations

import pytest

from corral.envs.wordle import WordleAction, WordleEnv, WordleTask, load_words
from corral.envs.wordle.game import split_of, split_words
from corral.errors import InvalidArgument


def test_the_shipped_list_splits_about_one_in_five_into_test() -> None:
    env = WordleEnv()
    assert env.splits() == ["train", "test"]
    train, test = env.num_tasks("train"), env.num_tasks("test")
    assert train + test == len(load_words())
    assert 0.15 < test / (train + test) < 0.25
    words = {env.task("train", i).word for i in range(train)}
    assert words.isdisjoint(env.task("test", i).word for i in range(test))


def test_a_words_split_does_not_depend_on_the_rest_of_the_list() -> None:
    words = list(load_words())
    full = split_words(words)
    half = split_words(words[::2])
    assert set(half["test"]) == {w for w in full["test"] if w in set(words[::2])}
    assert all(split_of(w) == "test" for w in full["test"])
    assert list(full["test"]) == sorted(full["test"])


def test_tasks_are_models_with_stable_ids() -> None:
    task = WordleEnv().task("test", 0)
    assert isinstance(task, WordleTask) and task.id == "test-0"
    assert task.word == split_words(load_words())["test"][0]


def test_reset_plays_the_chosen_task() -> None:
    env = WordleEnv()
    task = env.task("test", 5)
    env.reset(split="test", index=5)
    state = env.state()
    assert state.secret == task.word and state.task == "test-5"
    last = env.step(WordleAction(guess=task.word))
    assert last.done and last.metadata == {"success": True}


def test_a_lost_game_says_so() -> None:
    env = WordleEnv(words=["crane", "slate"])
    env.reset(word="crane", max_guesses=1)
    last = env.step(WordleAction(guess="slate"))
    assert last.done and last.reward and last.reward > 0 and last.metadata == {"success": False}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"split": "test"}, "both reset options split"),
        ({"split": "dev", "index": 0}, "unknown split 'dev'"),
        ({"split": "test", "index": 10_000}, "out of range"),
        ({"split": "test", "index": "3"}, "index"),
        ({"split": "test", "index": 0, "word": "crane"}, "pass one"),
    ],
)
def test_bad_task_options_are_invalid_arguments(options: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        WordleEnv().reset(**options)


def test_a_custom_list_has_its_own_tasks() -> None:
    env = WordleEnv(words=["crane", "slate", "bliss"])
    groups = split_words(["crane", "slate", "bliss"])
    assert env.num_tasks("test") == len(groups["test"])
    assert env.num_tasks("train") == len(groups["train"])
