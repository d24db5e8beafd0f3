"""The WebSocket upgrade decision, without a socket: every refusal, in order, and the gate."""

from __future__ import annotations

from corral.errors import ErrorCode
from corral.protocol.access import AccessPolicy, Refusal, RequestHead
from corral.protocol.handshake import RESUME_HEADER
from corral.protocol.registry import SessionRegistry
from corral.protocol.server import ConnectionGate
from corral.protocol.session import ReplyCache, SessionMachine, SessionState
from corral.protocol.upgrade import Accept, UpgradePolicy, admit_upgrade

TOKEN = "upgrade-token-123"


class Owner:
    def send(self, reply):  # pragma: no cover - nothing is delivered here
        raise AssertionError(reply)


def policy(*, token=None, limit=2, sessions=2, deflate=True) -> UpgradePolicy:
    registry = SessionRegistry(
        max_sessions=sessions, max_per_owner=8, resume_window_s=30.0, idle_timeout_s=600.0
    )
    return UpgradePolicy(AccessPolicy(token), ConnectionGate(limit), registry, deflate=deflate)


def upgrade(client="10.0.0.1", subprotocol="corral.v1.msgpack", **headers) -> RequestHead:
    pairs = [("Host", "127.0.0.1:9"), *((k.replace("_", "-"), v) for k, v in headers.items())]
    if subprotocol is not None:
        pairs.append(("Sec-WebSocket-Protocol", subprotocol))
    return RequestHead.of("GET", "/ws", pairs, client=client, local="127.0.0.1", websocket=True)


def fill(reg: SessionRegistry, n: int) -> list[str]:
    owner, ids = Owner(), []
    for i in range(n):
        reg.reserve(owner)
        sid = f"s{i}"
        session = SessionState(
            id=sid, token="t", machine=SessionMachine(), cache=ReplyCache(), owner=owner
        )
        reg.add(session, owner)
        ids.append(sid)
    return ids


def test_an_accept_names_the_codec_and_holds_one_gate_count():
    p = policy()
    answer = admit_upgrade(upgrade(subprotocol="x, corral.v1.json"), p)
    assert isinstance(answer, Accept) and answer.codec is not None
    assert answer.headers() == {"Sec-WebSocket-Protocol": "corral.v1.json"}
    assert p.gate.held == {"10.0.0.1": 1}
    p.gate.leave(answer.address)
    assert p.gate.held == {}


def test_deflate_is_agreed_only_when_offered_and_enabled():
    offer = {"sec_websocket_extensions": "permessage-deflate; client_max_window_bits"}
    on = admit_upgrade(upgrade(**offer), policy())
    assert isinstance(on, Accept) and on.deflate is not None
    assert on.headers()["Sec-WebSocket-Extensions"].startswith("permessage-deflate")
    off = admit_upgrade(upgrade(**offer), policy(deflate=False))
    assert isinstance(off, Accept) and off.deflate is None


def test_refusals_in_order_and_none_holds_the_gate():
    p = policy(token=TOKEN)
    foreign = admit_upgrade(upgrade(origin="http://evil.example"), p)
    assert isinstance(foreign, Refusal) and foreign.status == 403
    anonymous = admit_upgrade(upgrade(), p)
    assert isinstance(anonymous, Refusal) and anonymous.status == 401
    assert anonymous.error.code == ErrorCode.UNAUTHORIZED
    auth = {"authorization": f"Bearer {TOKEN}"}
    unknown = admit_upgrade(upgrade(subprotocol="chat", **auth), p)
    assert isinstance(unknown, Refusal) and unknown.status == 400
    assert unknown.error.code == ErrorCode.UNSUPPORTED_PROTOCOL
    assert p.gate.held == {}
    first, second = admit_upgrade(upgrade(**auth), p), admit_upgrade(upgrade(**auth), p)
    assert isinstance(first, Accept) and isinstance(second, Accept)
    third = admit_upgrade(upgrade(**auth), p)
    assert isinstance(third, Refusal) and third.status == 429
    assert third.error.code == ErrorCode.TOO_MANY_CONNECTIONS
    assert dict(third.headers) == {"Retry-After": "1"}
    assert p.gate.held == {"10.0.0.1": 2}
    # Another address has its own count.
    assert isinstance(admit_upgrade(upgrade(client="10.0.0.2", **auth), p), Accept)


def test_a_full_server_admits_only_a_client_coming_back_for_its_sessions():
    p = policy(sessions=2, limit=None)
    [live, _] = fill(p.registry, 2)
    full = admit_upgrade(upgrade(), p)
    assert isinstance(full, Refusal) and full.status == 503
    assert full.error.code == ErrorCode.CAPACITY_REACHED and dict(full.headers)["Retry-After"]
    assert p.gate.held == {}  # the refusal gave its count back
    stale = admit_upgrade(upgrade(**{RESUME_HEADER.replace("-", "_"): "gone"}), p)
    assert isinstance(stale, Refusal) and stale.status == 503
    back = admit_upgrade(upgrade(**{RESUME_HEADER.replace("-", "_"): f"gone,{live}"}), p)
    assert isinstance(back, Accept)


def test_a_server_that_cannot_serve_new_sessions_says_why_at_the_handshake():
    p = policy(limit=None)
    p.registry.unavailable = lambda: "draining: the server is stopping"
    refused = admit_upgrade(upgrade(), p)
    assert isinstance(refused, Refusal) and refused.status == 503
    assert refused.error.code == ErrorCode.NOT_READY
    assert refused.error.details["reason"].startswith("draining")
    # A client resuming its sessions is still let in (they live here).
    resuming = admit_upgrade(upgrade(**{RESUME_HEADER.replace("-", "_"): "s0"}), p)
    assert isinstance(resuming, Accept)


def test_the_fallback_takes_clients_without_a_corral_subprotocol():
    p = policy(sessions=1, limit=None)
    fill(p.registry, 1)
    answer = admit_upgrade(upgrade(subprotocol=None), p, fallback=True)
    # OpenEnv's envelope reports a full server its own way: no 503 at the handshake.
    assert isinstance(answer, Accept) and answer.codec is None and answer.deflate is None
    assert answer.headers() == {}
