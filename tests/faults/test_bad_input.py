"""Hypothesis fuzzing of frames against a running server process.

Random bytes and text, truncated msgpack and JSON, values nested thousands deep, huge
strings, a wrong type in every field of every message, unknown message types and
oversized frames go to a real server over both codecs. Every reply must be a structured
error (``type: error``, a stable code from :class:`ErrorCode`, a message, the request's
id when it was readable) on a connection that stays open; meanwhile a well-behaved
session on the same server steps without a single error, the process never dies, and
its memory does not keep growing. The number of inputs tried is reported.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.faults.conftest import local_server, rss_bytes, started
from tests.support.envs import CountAction, CounterEnv
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from corral.client import AsyncEnvClient
from corral.client.connection import ws_url
from corral.client.local_server import LocalServer
from corral.contract.schema import parse_semver
from corral.errors import ErrorCode
from corral.protocol.codecs import get_codec

FRAME_LIMIT = 256 * 1024
CODES = {str(code) for code in ErrorCode}
FUZZ_ID = st.integers(min_value=10_000, max_value=2**63 - 1)
"""Fuzz requests use ids the setup never used, so none hits a remembered success."""


class Peer:
    """A blocking connection with one session, sending raw frames."""

    def __init__(self, url: str, codec: str) -> None:
        self.url = url
        self.codec = get_codec(codec)
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            connect(
                ws_url(url),
                subprotocols=[self.codec.subprotocol],  # type: ignore[list-item]
                max_size=None,
                # No keepalive thread: its ping payloads come from the global random
                # module, which hypothesis watches while it generates inputs.
                ping_interval=None,
            )
        )
        assert self.request({"type": "hello", "id": 1, "protocol": "corral/1"})["type"] == "welcome"
        opened = self.request({"type": "open", "id": 2})
        self.session: str = opened["session"]
        assert self.request({"type": "reset", "id": 3, "session": self.session})["type"] == "result"

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.ws.send(self.codec.encode(message))
        return self.recv()

    def recv(self) -> dict[str, Any]:
        return self.codec.decode(self.ws.recv(timeout=15))

    def close(self) -> None:
        self._stack.close()


class Fuzzer:
    """Sends each input, checks its reply, counts inputs and error codes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.peers = {name: Peer(url, name) for name in ("msgpack", "json")}
        self.inputs = 0
        self.codes: Counter[str] = Counter()

    def expect_error(
        self, codec: str, frame: bytes | str, request_id: int | None = None
    ) -> dict[str, Any]:
        """Send ``frame``; its one reply must be a structured error."""
        peer = self.peers[codec]
        self.inputs += 1
        try:
            peer.ws.send(frame)
            reply = peer.recv()
        except ConnectionClosed as exc:
            raise AssertionError(f"the server closed the connection on {frame!r:.200}") from exc
        except TimeoutError as exc:
            raise AssertionError(f"no reply to {frame!r:.200}") from exc
        assert reply.get("type") == "error", (frame[:200], reply)
        assert reply.get("code") in CODES, reply
        # Bad input is the client's fault: never blamed on the env or on a corral bug.
        assert reply["code"] not in (ErrorCode.ENV_ERROR, ErrorCode.INTERNAL_ERROR), reply
        assert isinstance(reply.get("message"), str) and reply["message"], reply
        assert isinstance(reply.get("details"), dict), reply
        if request_id is not None:
            assert reply.get("id") == request_id, (request_id, reply)
        self.codes[reply["code"]] += 1
        return reply

    def message(self, codec: str, message: dict[str, Any]) -> dict[str, Any]:
        """Encode and send a (bad) message; its reply must be an error with its id."""
        rid = message.get("id")
        readable = isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < 2**63
        if codec == "json":
            message = _text_for_bytes(message)
        frame = self.peers[codec].codec.encode(message)
        return self.expect_error(codec, frame, rid if readable else None)

    def close(self) -> None:
        for peer in self.peers.values():
            peer.close()


def _text_for_bytes(value: Any) -> Any:
    """JSON has no bytes: a drawn ``bytes`` value crosses as a string of the same bytes."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return {k: _text_for_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_for_bytes(v) for v in value]
    return value


class Bystander(threading.Thread):
    """A well-behaved session stepping as fast as it can until told to stop."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.steps = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            # No keepalive: websockets draws ping payloads from the global random module,
            # which hypothesis (generating inputs in the main thread) would object to.
            client = AsyncEnvClient(self.url, env=CounterEnv, ping_interval=None)
            with client.sync() as env:
                env.reset(limit=10**9)
                while not self.stop.is_set():
                    result = env.step(CountAction(amount=1))
                    self.steps += 1
                    assert result.observation.total == self.steps
                    time.sleep(0.002)
        except BaseException as exc:
            self.errors.append(exc)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    srv = started(
        local_server(
            "tests.support.envs:CounterEnv",
            "--max-frame-bytes",
            str(FRAME_LIMIT),
            "--step-timeout",
            "5",
        )
    )
    yield srv
    srv.stop_now()


@pytest.fixture(scope="module")
def fuzz(server: LocalServer) -> Iterator[Fuzzer]:
    fuzzer = Fuzzer(server.url)
    yield fuzzer
    fuzzer.close()


@pytest.fixture(scope="module")
def bystander(server: LocalServer) -> Iterator[Bystander]:
    thread = Bystander(server.url)
    thread.start()
    yield thread
    thread.stop.set()
    thread.join(10)


@pytest.fixture(scope="module")
def baseline_rss(server: LocalServer, fuzz: Fuzzer, bystander: Bystander) -> int:
    """The server's RSS once the connections, the bystander and a warm-up are running."""
    assert server.process is not None
    for codec in ("msgpack", "json"):
        for _ in range(200):
            fuzz.message(codec, {"type": "nope", "id": 10_001, "payload": "x" * 100_000})
    time.sleep(0.2)
    return rss_bytes(server.process.pid)


def run(examples: int, strategy: st.SearchStrategy[Any], check: Any) -> None:
    """Run ``check`` over ``examples`` inputs drawn from ``strategy``."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def property_(value: Any) -> None:
        check(value)

    property_()


CODEC = st.sampled_from(["msgpack", "json"])

# Values of every wire type; "wrong" ones are drawn from here, minus the right type.
ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=50)
    | st.binary(max_size=50),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

# For each message type, its fields and a test of "this value has the right type".
FIELDS: dict[str, dict[str, Any]] = {
    "hello": {
        "protocol": lambda v: isinstance(v, str),
        "client": lambda v: v is None or isinstance(v, str),
        "contract": lambda v: v is None,  # any non-null contract here is malformed (below)
        "schemas": lambda v: v is None or isinstance(v, bool),
    },
    "attach": {"session": lambda v: isinstance(v, str), "token": lambda v: isinstance(v, str)},
    "reset": {
        "session": lambda v: isinstance(v, str),
        "seed": lambda v: v is None,  # a valid seed would make a valid reset
        "options": lambda v: v is None,
    },
    "step": {"session": lambda v: isinstance(v, str), "action": lambda v: False},
    "state": {"session": lambda v: isinstance(v, str)},
    "close": {"session": lambda v: isinstance(v, str)},
    "open": {},
}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


@st.composite
def wrong_field(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A message of a known type with exactly one field of a wrong type (or value)."""
    codec = draw(CODEC)
    kind = draw(st.sampled_from(sorted(FIELDS)))
    fields = FIELDS[kind]
    message: dict[str, Any] = {"type": kind, "id": draw(FUZZ_ID)}
    if kind == "hello":
        message["protocol"] = "corral/1"
    if "session" in fields:
        message["session"] = "<filled in>"
    if kind == "attach":
        message["token"] = "not-the-token"
    if kind == "step":
        message["action"] = {"amount": 1}
    target = draw(st.sampled_from([*sorted(fields), "id"]))
    if target == "id":
        message["id"] = draw(ANY.filter(lambda v: not is_int(v)))
    elif target == "contract":
        message["contract"] = draw(
            ANY.filter(lambda v: v is not None and not isinstance(v, dict))
            | st.fixed_dictionaries({"version": ANY.filter(lambda v: not isinstance(v, str))})
            | st.fixed_dictionaries({"version": st.text(max_size=20).filter(_not_semver)})
            | st.fixed_dictionaries({"version": st.integers(2, 99).map(lambda n: f"{n}.0.0")})
        )
    elif target == "action":  # never a valid CountAction: not a map, or an unknown field
        message["action"] = draw(
            (
                ANY.filter(lambda v: not isinstance(v, dict))
                | st.dictionaries(
                    st.text(min_size=1, max_size=8).map(lambda k: f"bogus_{k}"), ANY, min_size=1
                )
                | st.fixed_dictionaries({"amount": ANY})
            ).filter(invalid_action)
        )
    elif target == "seed":
        message["seed"] = draw(ANY.filter(lambda v: v is not None and not is_int(v)))
    elif target == "options":  # not a map, or a map of options reset() does not accept
        message["options"] = draw(
            ANY.filter(lambda v: v is not None and not isinstance(v, dict))
            | st.dictionaries(
                st.text(min_size=1, max_size=8).map(lambda k: f"bogus_{k}"), ANY, min_size=1
            )
        )
    else:
        wrong = draw(ANY.filter(lambda v, ok=fields[target]: not ok(v)))
        # JSON carries bytes as text, which may make the value right after all.
        assume(codec != "json" or not fields[target](_text_for_bytes(wrong)))
        message[target] = wrong
    return codec, message


def _not_semver(text: str) -> bool:
    try:
        parse_semver(text)
    except ValueError:
        return True
    return False


def invalid_action(value: Any) -> bool:
    """True when ``value`` is no valid CountAction under either codec's validation."""
    for validate in (
        lambda: CountAction.model_validate(value),
        lambda: CountAction.model_validate_json(orjson.dumps(_text_for_bytes(value))),
    ):
        try:
            validate()
        except Exception:
            continue
        return False
    return True


def with_session(fuzz: Fuzzer, codec: str, message: dict[str, Any]) -> dict[str, Any]:
    if message.get("session") == "<filled in>":
        message["session"] = fuzz.peers[codec].session
    return message


def nested(depth: int, kind: str, codec: str) -> bytes | str:
    """A value nested ``depth`` deep, encoded by hand (encoders refuse such depths)."""
    if codec == "msgpack":
        return (b"\x91" * depth if kind == "list" else b"\x81\xa1k" * depth) + b"\xc0"
    return (
        ("[" * depth + "]" * depth) if kind == "list" else ('{"k":' * depth + "null" + "}" * depth)
    )


def splice(codec: str, message: dict[str, Any], value: bytes | str) -> bytes | str:
    """Encode ``message`` with its last field (null) replaced by the raw ``value``."""
    if codec == "msgpack":
        frame = msgpack.packb(message)
        assert frame.endswith(b"\xc0")
        return frame[:-1] + value  # type: ignore[operator]
    text = orjson.dumps(message).decode()
    assert text.endswith("null}")
    return text[: -len("null}")] + str(value) + "}"


def test_random_bytes_and_text(fuzz, scale, baseline_rss):
    run(scale.fuzz_examples, st.binary(max_size=4096), lambda b: fuzz.expect_error("msgpack", b))
    run(scale.fuzz_examples, st.text(max_size=2048), lambda t: fuzz.expect_error("json", t))
    # Binary frames on the JSON codec must be UTF-8 JSON; text frames on msgpack are refused.
    run(scale.fuzz_examples // 4, st.binary(max_size=512), lambda b: fuzz.expect_error("json", b))
    run(scale.fuzz_examples // 4, st.text(max_size=512), lambda t: fuzz.expect_error("msgpack", t))


VALID = st.sampled_from(
    [
        {"type": "hello", "protocol": "corral/1", "client": "x", "schemas": True},
        {"type": "reset", "session": "<filled in>", "seed": 3, "options": {"limit": 5}},
        {"type": "step", "session": "<filled in>", "action": {"amount": 2, "note": "hi"}},
        {"type": "state", "session": "<filled in>"},
        {"type": "attach", "session": "<filled in>", "token": "t" * 30},
    ]
)


def test_truncated_frames(fuzz, scale, baseline_rss):
    def check(args: tuple[str, dict[str, Any], int, int]) -> None:
        codec, message, rid, cut = args
        message = with_session(fuzz, codec, {**message, "id": rid})
        frame = fuzz.peers[codec].codec.encode(message)
        fuzz.expect_error(codec, frame[: cut % len(frame)])  # every proper prefix is broken

    run(scale.fuzz_examples, st.tuples(CODEC, VALID, FUZZ_ID, st.integers(0, 10**6)), check)


def test_deeply_nested_values(fuzz, scale, baseline_rss):
    def check(args: tuple[str, str, int, str]) -> None:
        codec, kind, depth, where = args
        peer = fuzz.peers[codec]
        value = nested(depth, kind, codec)
        if where == "frame":  # the whole frame is the nested value
            fuzz.expect_error(codec, value)
            return
        message: dict[str, Any] = {"type": "step", "id": 20_000, "session": peer.session}
        if where == "action":
            message["action"] = None
        elif where == "options":
            message = {"type": "reset", "id": 20_001, "session": peer.session, "options": None}
        elif where == "id":
            message = {"type": "state", "session": peer.session, "id": None}
        elif where == "type":
            message = {"id": 20_002, "session": peer.session, "type": None}
        frame = splice(codec, message, value)
        rid = None if where == "id" else message["id"]
        fuzz.expect_error(codec, frame, rid if depth < 200 else None)

    # Up to 50,000 deep: the frame then stays under the transport's cap (2 x the limit).
    depths = st.integers(1, 50_000) | st.sampled_from([100, 254, 255, 256, 511, 512, 1023, 1024])
    run(
        scale.fuzz_examples,
        st.tuples(
            CODEC,
            st.sampled_from(["list", "dict"]),
            depths,
            st.sampled_from(["frame", "action", "options", "id", "type"]),
        ),
        check,
    )


def test_huge_strings(fuzz, scale, baseline_rss):
    def check(args: tuple[str, str, int]) -> None:
        codec, where, size = args
        peer = fuzz.peers[codec]
        huge = "ü" * (size // 2)
        message: dict[str, Any] = {"type": "step", "id": 30_000, "session": peer.session}
        if where == "type":
            message["type"] = huge
        elif where == "session":
            message["session"] = huge
        elif where == "action":
            message["action"] = {"note": huge, "bogus": 1}
        elif where == "option":
            message = {"type": "reset", "id": 30_001, "session": peer.session, "options": {huge: 1}}
        elif where == "token":
            message = {"type": "attach", "id": 30_002, "session": peer.session, "token": huge}
        fuzz.message(codec, message)

    sizes = st.integers(1_000, FRAME_LIMIT // 2 - 1_000)
    run(
        max(10, scale.fuzz_examples // 5),
        st.tuples(CODEC, st.sampled_from(["type", "session", "action", "option", "token"]), sizes),
        check,
    )


def test_wrong_type_in_every_field(fuzz, scale, baseline_rss):
    def check(args: tuple[str, dict[str, Any]]) -> None:
        codec, message = args
        fuzz.message(codec, with_session(fuzz, codec, message))

    run(scale.fuzz_examples * 2, wrong_field(), check)


def test_unknown_message_types(fuzz, scale, baseline_rss):
    known = {"hello", "open", "attach", "reset", "step", "state", "close"}

    def check(args: tuple[str, str, int, dict[str, Any]]) -> None:
        codec, kind, rid, extra = args
        reply = fuzz.message(codec, {**extra, "type": kind, "id": rid})
        assert reply["code"] == ErrorCode.UNKNOWN_TYPE

    run(
        scale.fuzz_examples,
        st.tuples(
            CODEC,
            st.text(max_size=30).filter(lambda t: t not in known),
            FUZZ_ID,
            st.dictionaries(
                st.text(max_size=5).filter(lambda k: k not in ("type", "id")), ANY, max_size=3
            ),
        ),
        check,
    )


def test_oversized_frames(server, fuzz, baseline_rss):
    for codec in ("msgpack", "json"):
        peer = fuzz.peers[codec]
        for size in (FRAME_LIMIT + 1, FRAME_LIMIT * 3 // 2, FRAME_LIMIT * 2):
            message = {
                "type": "step",
                "id": 40_000,
                "session": peer.session,
                "action": {"note": ""},
            }
            overhead = len(peer.codec.encode(message))
            message["action"]["note"] = "x" * (size - overhead)
            reply = fuzz.message(codec, message)
            assert reply["code"] == ErrorCode.FRAME_TOO_LARGE
            assert reply["details"]["limit"] == FRAME_LIMIT
    # Far beyond the limit the transport itself closes the connection (code 1009); the
    # server and every other connection carry on.
    far = Peer(server.url, "msgpack")
    far.ws.send(b"\x00" * (FRAME_LIMIT * 4))
    with pytest.raises(ConnectionClosed) as closed:
        far.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    fuzz.inputs += 1
    fuzz.codes["close-1009"] += 1


def test_server_survived_the_fuzz(server, fuzz, bystander, baseline_rss, figures):
    assert server.running
    for peer in fuzz.peers.values():  # the fuzzed connections still work normally
        assert (
            peer.request({"type": "state", "id": 3_000_000, "session": peer.session})["type"]
            == "state"
        )
    assert httpx.get(f"{server.url}/health", trust_env=False).json() == {"status": "healthy"}
    bystander.stop.set()
    bystander.join(10)
    assert bystander.errors == []
    assert bystander.steps > 0
    assert server.process is not None
    rss = rss_bytes(server.process.pid)
    figures["inputs_fuzzed"] = fuzz.inputs
    figures["error_codes"] = dict(sorted(fuzz.codes.items()))
    figures["bystander_steps"] = bystander.steps
    figures["bystander_errors"] = len(bystander.errors)
    figures["rss_baseline_mb"] = round(baseline_rss / 2**20, 1)
    figures["rss_after_mb"] = round(rss / 2**20, 1)
    print(f"\nfuzzed {fuzz.inputs} inputs: {dict(fuzz.codes)}")
    # Bounded: the fuzz may warm caches, but must not keep what it was sent.
    assert rss < baseline_rss + 64 * 2**20, (baseline_rss, rss)
