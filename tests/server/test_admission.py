"""Admission: payloads into environment calls and results back out, the same for a single
request and a batch item. Pure functions of the contract; no server needed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from tests.support.envs import CountAction, CounterEnv, CountObservation, CountState

from corral.contract import Environment, State
from corral.contract.environment import ActionMigration
from corral.errors import (
    BadObservation,
    EnvError,
    ErrorCode,
    InvalidAction,
    InvalidArgument,
    StepTimeout,
)
from corral.protocol import batch as b
from corral.protocol import messages as m
from corral.protocol.codecs import Codec, JsonCodec, MsgpackCodec
from corral.protocol.session import Op, ReplyCache, SessionMachine, SessionState
from corral.server.admission import Admission


@dataclass
class Peer:
    codec: Codec
    migrate: ActionMigration | None = None

    def send(self, reply: m.Reply) -> None:  # pragma: no cover - admission sends nothing
        raise AssertionError(reply)


def admission(env: type[Environment[Any, Any, Any]] = CounterEnv) -> Admission:
    return Admission(env, env.contract())


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_single_requests_and_batch_items_make_the_same_calls(codec):
    adm, peer = admission(), Peer(codec)
    for step in (m.Step(1, "s", {"amount": 3}), b.StepItem("s", {"amount": 3})):
        method, args, kwargs = adm.call(peer, Op.STEP, step)
        assert (method, args, kwargs) == ("step", (CountAction(amount=3),), {})
    for reset in (m.Reset(1, "s", 7, {"limit": 2}), b.ResetItem("s", 7, {"limit": 2})):
        assert adm.call(peer, Op.RESET, reset) == ("reset", (7,), {"limit": 2})
    for step in (m.Step(1, "s", {}), b.StepItem("s", {})):  # an auto-reset: no options
        assert adm.call(peer, Op.AUTO_RESET, step) == ("reset", (None,), {})
    assert adm.call(peer, Op.STATE, m.GetState(1, "s")) == ("state", (), {})


def test_invalid_actions_and_options():
    adm, peer = admission(), Peer(MsgpackCodec())
    with pytest.raises(InvalidAction) as wrong:
        adm.call(peer, Op.STEP, b.StepItem("s", {"amount": "lots", "bogus": 1}))
    assert [e["loc"] for e in wrong.value.details["errors"]] == [["amount"], ["bogus"]]
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidAction) as unreadable:
        adm.call(Peer(JsonCodec()), Op.STEP, m.Step(1, "s", {"note": deep}))
    assert unreadable.value.details["errors"][0]["type"] == "unreadable"
    with pytest.raises(InvalidArgument) as unknown:
        adm.call(peer, Op.RESET, m.Reset(1, "s", None, {"nope": 1, "limit": 1}))
    assert unknown.value.details == {"unknown": ["nope"], "accepted": ["label", "limit"]}


def test_actions_of_an_older_contract_are_migrated():
    adm = admission()
    peer = Peer(MsgpackCodec(), migrate=lambda action: {"amount": action.pop("count")})
    assert adm.action(peer, {"count": 4}) == CountAction(amount=4)
    with pytest.raises(InvalidAction):
        adm.action(peer, [1])  # not a map: not migrated, and not an action either


def test_results_are_checked_and_dumped():
    adm, peer = admission(), Peer(MsgpackCodec())
    payload, done = adm.result(peer, CountObservation(total=2, done=True), Op.STEP)
    assert payload["total"] == 2 and done is True
    with pytest.raises(BadObservation, match=r"CounterEnv.step\(\) returned dict"):
        adm.result(peer, {"total": 2}, Op.STEP)
    with pytest.raises(BadObservation, match=r"CounterEnv.reset\(\) returned"):
        adm.result(peer, State(), Op.AUTO_RESET)
    assert adm.state(peer, CountState(total=1))["total"] == 1
    with pytest.raises(BadObservation, match="not a State"):
        adm.state(peer, CountObservation())


def test_a_result_that_cannot_be_dumped():
    adm = admission()
    value = CountObservation(when=None)
    object.__setattr__(value, "tags", {1: object()})  # past validation: a broken model
    with pytest.raises(BadObservation, match="could not be serialized") as info:
        adm.result(Peer(JsonCodec()), value, Op.STEP)
    assert info.value.details == {"model": "CountObservation"}


# The broken model dumps with pydantic's "unexpected value" warnings on msgpack.
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_a_batch_is_admitted_as_its_items_one_by_one(codec):
    # The batch forms load and dump a whole list at once; an item at fault must still
    # get the very error it gets on its own, and its neighbours their own answers.
    adm, peer = admission(), Peer(codec)
    raws: list[Any] = [{"amount": 1}, {"amount": "lots"}, [1], {"amount": 2}]
    batch = adm.actions(peer, raws)
    for raw, got in zip(raws, batch, strict=True):
        try:
            alone: Any = adm.action(peer, raw)
        except InvalidAction as exc:
            assert isinstance(got, InvalidAction) and got.to_wire() == exc.to_wire()
        else:
            assert got == alone
    assert adm.actions(peer, raws[:1]) == [CountAction(amount=1)]

    broken = CountObservation(total=3)
    object.__setattr__(broken, "tags", {1: object()})  # past validation: a broken model
    values: list[Any] = [
        CountObservation(total=1, reward=0.5),
        {"total": 2},
        CountObservation(total=2, done=True, reward=1.0, reward_components={"x": 1.0}),
        CountObservation(reward=float("nan")),
        broken,
    ]
    ops = [Op.STEP, Op.STEP, Op.STEP, Op.RESET, Op.STEP]
    rewards = adm.rewards.reward.observations
    results = adm.results(peer, values, ops)
    counted = adm.rewards.reward.observations - rewards
    for value, op, got in zip(values, ops, results, strict=True):
        try:
            expected: Any = adm.result(peer, value, op)
        except BadObservation as exc:
            assert isinstance(got, BadObservation) and got.to_wire() == exc.to_wire()
        else:
            assert repr(got) == repr(expected)
    # Counted once each by the batch (and again by the one-by-one calls above).
    assert counted == adm.rewards.reward.observations - rewards - counted
    assert adm.rewards.components["x"].observations == 2


def test_failures_map_to_stable_codes():
    adm, session = (
        admission(),
        SessionState(id="s1", token="t", machine=SessionMachine(), cache=ReplyCache(1), owner=None),
    )
    timeout = StepTimeout("slow")
    assert adm.failure(timeout, Op.STEP, session) is timeout
    error = adm.failure(KeyError("k"), Op.RESET, session)
    assert isinstance(error, EnvError) and error.code == ErrorCode.ENV_ERROR
    assert error.details == {"exception": "KeyError", "op": "reset"}
