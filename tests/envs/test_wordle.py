"""The Wordle environment, its rules and its policy helper, called in-process."""

from __future__ import annotations

from collections import Counter
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from corral.envs.wordle import (
    SimplePolicy,
    WordleAction,
    WordleEnv,
    WordleObservation,
    WordleState,
    load_words,
    score_guess,
)
from corral.envs.wordle.game import consistent_words, parse_word_list, pattern_scores


def play(env: WordleEnv, guesses: list[str]) -> list[WordleObservation]:
    """Step ``env`` with each guess; return the observations."""
    return [env.step(WordleAction(guess=g)) for g in guesses]


# --- scoring -------------------------------------------------------------------------------

SCORING_CASES = [
    # (secret, guess, pattern)
    ("crane", "crane", "GGGGG"),
    ("crane", "nacre", "YYYYG"),
    ("crane", "bliss", "....."),
    ("those", "geese", "...GG"),  # the green e's use up the secret's only e
    ("abbey", "keeps", ".Y..."),  # one e in the secret: only the first guessed e is yellow
    ("abbey", "bobby", "Y.G.G"),  # green b first, the one b left goes to the leftmost b
    ("apple", "eagle", ".Y.GG"),  # the secret's only e is green, so the earlier e is gray
    ("llama", "alarm", "YGG.Y"),
    ("abide", "speed", "..Y.Y"),
    ("speed", "abide", "...YY"),
    ("hello", "lolly", ".YGG."),  # two l's in the secret, both green: the third l is gray
    ("eerie", "eeeee", "GG..G"),
    ("sweet", "eerie", "YY..."),  # two e's in the secret: two yellows, the third e gray
    ("robot", "floor", "..YGY"),
    ("mamma", "maxim", "GG..Y"),
]


@pytest.mark.parametrize(("secret", "guess", "pattern"), SCORING_CASES)
def test_score_guess_matches_wordle(secret: str, guess: str, pattern: str) -> None:
    assert score_guess(guess, secret) == pattern


@pytest.mark.parametrize(("secret", "guess", "pattern"), SCORING_CASES)
def test_env_feedback_matches_wordle(secret: str, guess: str, pattern: str) -> None:
    env = WordleEnv(words=[secret, guess])
    env.reset(word=secret)
    obs = env.step(WordleAction(guess=guess))
    assert obs.pattern == pattern
    assert obs.feedback == pattern_scores(pattern)
    assert obs.history[-1].guess == guess
    assert obs.history[-1].pattern == pattern


five_letters = st.text(alphabet="abcde", min_size=5, max_size=5)


@given(guess=five_letters, secret=five_letters)
def test_score_guess_invariants(guess: str, secret: str) -> None:
    pattern = score_guess(guess, secret)
    for i, mark in enumerate(pattern):
        assert (mark == "G") == (guess[i] == secret[i])
    # Each letter is credited (green or yellow) as often as it appears in both words.
    in_secret = Counter(secret)
    for letter, count in Counter(guess).items():
        credited = sum(1 for g, m in zip(guess, pattern, strict=True) if g == letter and m != ".")
        assert credited == min(count, in_secret[letter])
    # Yellows go to the leftmost uncredited copies of a letter.
    for i, mark in enumerate(pattern):
        if mark == "Y":
            earlier = [j for j in range(i) if guess[j] == guess[i]]
            assert all(pattern[j] != "." for j in earlier)


@pytest.mark.parametrize(
    ("guess", "secret"), [("Crane", "crane"), ("cran", "crane"), ("crane", "cr4ne")]
)
def test_score_guess_rejects_malformed_words(guess: str, secret: str) -> None:
    with pytest.raises(ValueError, match="5 lowercase ASCII letters"):
        score_guess(guess, secret)


def test_pattern_scores_spells_out_and_validates() -> None:
    assert pattern_scores("GY..G") == ["correct", "present", "absent", "absent", "correct"]
    with pytest.raises(ValueError, match="5 marks"):
        pattern_scores("GYX.G")
    with pytest.raises(ValueError, match="5 marks"):
        pattern_scores("GG")


def test_consistent_words_filters_by_pattern() -> None:
    words = ["crane", "crate", "trace", "bliss", "cr4ne"]
    assert consistent_words(words, "crane", "GGG.G") == ("crate",)
    assert consistent_words(words, "crane", "YGG.G") == ("trace",)
    assert consistent_words(words, "bliss", "GGGGG") == ("bliss",)
    with pytest.raises(ValueError, match="5 marks"):
        consistent_words(words, "crane", "GGG")


# --- word list -----------------------------------------------------------------------------


def test_shipped_word_list_is_clean_and_packaged() -> None:
    words = load_words()
    assert 300 <= len(words) <= 2000
    assert list(words) == sorted(set(words))
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in words)
    data = resources.files("corral.envs.wordle").joinpath("words.txt")
    assert data.is_file()
    assert WordleEnv().words == words


def test_parse_word_list_names_the_bad_line() -> None:
    assert parse_word_list(["# comment", "", "Crane", "crane", "bliss"]) == ("bliss", "crane")
    with pytest.raises(ValueError, match=r"line 2: 'abc' is not a 5-letter word"):
        parse_word_list(["crane", "abc"])
    with pytest.raises(ValueError, match="contains no words"):
        parse_word_list(["# only a comment"])


def test_custom_word_list_is_validated() -> None:
    with pytest.raises(ValueError, match="not a 5-letter word"):
        WordleEnv(words=["crane", "toolong"])


# --- actions -------------------------------------------------------------------------------


@pytest.mark.parametrize("guess", ["CRANE", "Crane", "crane", "cRaNe"])
def test_action_normalises_case(guess: str) -> None:
    assert WordleAction(guess=guess).guess == "crane"


@pytest.mark.parametrize(
    "guess", ["", "abc", "cranes", "cr4ne", "cr ne", " crane", "héllo", "crân"]
)
def test_action_rejects_non_words(guess: str) -> None:
    with pytest.raises(ValidationError, match="exactly 5 ASCII letters"):
        WordleAction(guess=guess)


def test_action_rejects_non_strings_and_extra_fields() -> None:
    with pytest.raises(ValidationError):
        WordleAction.model_validate({"guess": 12345})
    with pytest.raises(ValidationError, match="Extra inputs"):
        WordleAction.model_validate({"guess": "crane", "hint": True})


def test_action_schema_documents_the_pattern() -> None:
    schemas = WordleEnv.contract().schemas
    assert schemas["action"]["properties"]["guess"]["pattern"] == "^[A-Za-z]{5}$"
    assert "secret" in schemas["state"]["properties"]
    assert len(WordleEnv.contract().fingerprint) > 0


# --- seeds and determinism -----------------------------------------------------------------


def test_same_seed_same_secret_and_observations() -> None:
    guesses = ["crane", "zzzzz", "bliss", "moody", "pouch", "dwelt", "fight", "vague"]
    runs = []
    for _ in range(2):
        env = WordleEnv()
        first = env.reset(seed=1234)
        obs = [first]
        for g in guesses:
            obs.append(env.step(WordleAction(guess=g)))
            if obs[-1].done:
                break
        runs.append(([o.model_dump() for o in obs], env.state().secret))
    assert runs[0] == runs[1]


def test_seed_selects_secret_independently_of_list_order() -> None:
    words = list(load_words())
    forward, backward = WordleEnv(words=words), WordleEnv(words=reversed(words))
    for seed in range(10):
        forward.reset(seed=seed)
        backward.reset(seed=seed)
        assert forward.state().secret == backward.state().secret


def test_different_seeds_and_no_seed_vary_the_secret() -> None:
    env = WordleEnv()
    seeded = set()
    for seed in range(30):
        env.reset(seed=seed)
        seeded.add(env.state().secret)
    assert len(seeded) > 10
    unseeded = set()
    for _ in range(20):
        env.reset()
        unseeded.add(env.state().secret)
    assert len(unseeded) > 1
    assert unseeded <= set(env.words)


# --- episode flow --------------------------------------------------------------------------


def test_reset_observation() -> None:
    env = WordleEnv()
    obs = env.reset(seed=3, max_guesses=4, max_turns=9)
    assert obs.done is False and obs.truncated is False and obs.reward is None
    assert obs.guesses_left == 4 and obs.turns_left == 9
    assert obs.history == [] and obs.pattern == "" and obs.feedback == []
    assert obs.secret is None
    assert "4 guesses" in obs.message


def test_solving_terminates_with_bonus_and_reveals_secret() -> None:
    env = WordleEnv()
    env.reset(word="crane")
    first, second = play(env, ["bliss", "crane"])
    assert first.done is False and first.secret is None
    assert second.done is True and second.truncated is False
    assert second.reward == pytest.approx(1.0 + 0.1 * 4)
    assert second.secret == "crane"
    assert "solved in 2 guesses" in second.message
    state = env.state()
    assert state.solved is True and state.done is True


def test_solving_on_the_first_guess_pays_most() -> None:
    env = WordleEnv()
    env.reset(word="crane")
    assert play(env, ["crane"])[0].reward == pytest.approx(1.0 + 0.1 * 5)


def test_running_out_of_guesses_terminates() -> None:
    env = WordleEnv()
    env.reset(word="crane", max_guesses=3)
    observations = play(env, ["bliss", "moody", "fight"])
    assert [o.guesses_left for o in observations] == [2, 1, 0]
    assert [o.done for o in observations] == [False, False, True]
    last = observations[-1]
    assert last.truncated is False
    assert last.secret == "crane"
    assert "Out of guesses" in last.message and "crane" in last.message
    assert env.state().solved is False


def test_turn_limit_truncates() -> None:
    env = WordleEnv()
    env.reset(word="crane", max_turns=3)
    observations = play(env, ["zzzzz", "bliss", "qqqqq"])
    assert [o.done for o in observations] == [False, False, True]
    assert [o.turns_left for o in observations] == [2, 1, 0]
    last = observations[-1]
    assert last.truncated is True
    assert last.secret == "crane"
    assert "Turn limit (3)" in last.message
    assert env.state().done is True and env.state().solved is False


def test_termination_wins_over_truncation_on_the_same_step() -> None:
    env = WordleEnv()
    env.reset(word="crane", max_turns=2)
    last = play(env, ["zzzzz", "crane"])[-1]
    assert last.done is True and last.truncated is False
    env.reset(word="crane", max_turns=2, max_guesses=2)
    last = play(env, ["bliss", "moody"])[-1]
    assert last.done is True and last.truncated is False


def test_no_turn_limit() -> None:
    env = WordleEnv(max_turns=None)
    obs = env.reset(word="crane")
    assert obs.turns_left is None
    observations = play(env, ["zzzzz"] * 50)
    assert not any(o.done for o in observations)
    assert all(o.turns_left is None for o in observations)


def test_word_not_in_list_uses_a_turn_not_a_guess() -> None:
    env = WordleEnv()
    env.reset(word="crane")
    play(env, ["bliss"])
    obs = env.step(WordleAction(guess="QZXVJ"))
    assert obs.accepted is False
    assert obs.guess == "qzxvj"
    assert obs.reward == 0.0
    assert obs.guesses_left == 5
    assert obs.turns_left == 18
    assert obs.pattern == "" and obs.feedback == []
    assert [r.guess for r in obs.history] == ["bliss"]
    assert "not in the word list" in obs.message and "did not use a guess" in obs.message
    assert obs.done is False
    state = env.state()
    assert state.rejected == 1 and state.guesses_made == 1 and state.step_count == 2


def test_shaped_rewards_for_new_greens_and_yellows() -> None:
    env = WordleEnv()
    env.reset(word="llama")
    alarm, again, mambo = play(env, ["alarm", "alarm", "mambo"])
    # alarm → YGG.Y: new greens at 1 and 2, new letters a, l, m.
    assert alarm.reward == pytest.approx(2 * 0.1 + 3 * 0.05)
    assert again.reward == 0.0
    # mambo → YY... : nothing new (m and a were already known).
    assert mambo.pattern == "YY..."
    assert mambo.reward == 0.0


def test_step_outside_an_episode_is_refused() -> None:
    env = WordleEnv()
    with pytest.raises(RuntimeError, match=r"reset\(\) before step\(\)"):
        env.step(WordleAction(guess="crane"))
    env.reset(word="crane")
    play(env, ["crane"])
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(WordleAction(guess="crane"))


# --- reset options -------------------------------------------------------------------------


def test_forced_word_is_case_insensitive_and_must_be_listed() -> None:
    env = WordleEnv()
    env.reset(word="CRANE")
    assert env.state().secret == "crane"
    with pytest.raises(ValueError, match=r"word='qzxvj' is not in the word list"):
        env.reset(word="qzxvj")


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"max_guesses": 0}, "max_guesses"),
        ({"max_guesses": 101}, "max_guesses"),
        ({"max_guesses": "6"}, "max_guesses"),
        ({"max_guesses": True}, "max_guesses"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_tries": 3}, "max_tries: Extra inputs are not permitted"),
        ({"word": 5}, "word"),
    ],
)
def test_bad_reset_options_fail_clearly(options: dict[str, object], needle: str) -> None:
    env = WordleEnv()
    with pytest.raises(ValueError, match="invalid wordle options") as info:
        env.reset(seed=1, **options)
    assert needle in str(info.value)
    assert "Accepted options" in str(info.value)


def test_bad_constructor_defaults_fail_clearly() -> None:
    with pytest.raises(ValueError, match="max_guesses"):
        WordleEnv(max_guesses=0)


def test_constructor_defaults_apply_and_options_override() -> None:
    env = WordleEnv(max_guesses=3, max_turns=5)
    env.reset(seed=0)
    assert (env.state().max_guesses, env.state().max_turns) == (3, 5)
    env.reset(seed=0, max_guesses=6, max_turns=None)
    assert (env.state().max_guesses, env.state().max_turns) == (6, None)


# --- state ---------------------------------------------------------------------------------


def test_state_contents() -> None:
    env = WordleEnv()
    fresh = env.state()
    assert isinstance(fresh, WordleState) and fresh.secret is None
    env.reset(seed=42, word="crane", episode_id="ep-1", max_guesses=5)
    play(env, ["bliss", "zzzzz", "trace"])
    state = env.state()
    assert state.episode_id == "ep-1"
    assert state.seed == 42
    assert state.secret == "crane"
    assert state.max_guesses == 5 and state.max_turns == 20
    assert state.guesses == ["bliss", "trace"]
    assert state.guesses_made == 2
    assert state.rejected == 1
    assert state.step_count == 3
    assert state.solved is False and state.done is False


def test_state_is_a_copy() -> None:
    env = WordleEnv()
    env.reset(word="crane")
    play(env, ["bliss"])
    snapshot = env.state()
    snapshot.guesses.append("tamper")
    snapshot.secret = "moody"
    assert env.state().guesses == ["bliss"]
    assert env.state().secret == "crane"


def test_reset_starts_a_clean_episode() -> None:
    env = WordleEnv()
    env.reset(word="crane")
    play(env, ["bliss", "crane"])
    obs = env.reset(word="moody")
    assert obs.history == []
    state = env.state()
    assert state.guesses == [] and state.step_count == 0 and not state.solved and not state.done


def test_observations_round_trip_through_json() -> None:
    env = WordleEnv()
    env.reset(word="crane")
    for obs in play(env, ["bliss", "zzzzz", "crane"]):
        assert WordleObservation.model_validate_json(obs.model_dump_json()) == obs
    state = env.state()
    assert WordleState.model_validate_json(state.model_dump_json()) == state


# --- policy --------------------------------------------------------------------------------


def test_policy_solves_most_games() -> None:
    env = WordleEnv()
    policy = SimplePolicy()
    solved = 0
    for seed in range(200):
        policy.reset(seed=seed)
        obs = env.reset(seed=seed)
        while not obs.done:
            obs = env.step(policy.act(obs))
        state = env.state()
        assert state.rejected == 0  # it only guesses listed words
        solved += state.solved and state.guesses_made <= 6
    assert solved >= 180


def test_policy_keeps_only_consistent_candidates() -> None:
    policy = SimplePolicy(seed=0)
    policy.observe("crane", score_guess("crane", "crate"))
    assert "crate" in policy.candidates
    assert all(score_guess("crane", w) == "GGG.G" for w in policy.candidates)
    assert policy.next_guess() in policy.candidates
    with pytest.raises(ValueError, match="5 marks"):
        policy.observe("crane", "GGXGG")
    with pytest.raises(ValueError, match="5 lowercase ASCII letters"):
        policy.observe("cran", "GGGGG")


def test_policy_is_seeded_and_restarts_on_a_new_episode() -> None:
    env = WordleEnv()

    def episode(policy: SimplePolicy, seed: int) -> list[str]:
        obs = env.reset(seed=seed)
        guesses = []
        while not obs.done:
            action = policy.act(obs)
            guesses.append(action.guess)
            obs = env.step(action)
        return guesses

    one, two = SimplePolicy(seed=5), SimplePolicy(seed=5)
    assert episode(one, 11) == episode(two, 11)
    # The same instance carries on into a new episode with a full candidate list.
    episode(one, 12)
    assert env.state().solved or env.state().guesses_made == 6
    one.act(env.reset(seed=13))
    assert len(one.candidates) == len(load_words())


def test_policy_falls_back_when_the_secret_is_unknown() -> None:
    policy = SimplePolicy(words=["crane", "bliss"], seed=0)
    policy.observe("crane", ".....")
    policy.observe("bliss", ".....")
    assert policy.candidates == ()
    assert policy.next_guess() in {"crane", "bliss"}
    with pytest.raises(ValueError, match="top must be at least 1"):
        SimplePolicy(top=0)
