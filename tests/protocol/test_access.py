"""Who may use a server: Host, Origin, credentials and body type, decided from a head."""

from __future__ import annotations

import pytest

from corral.auth import COOKIE_NAME, issue_cookie
from corral.errors import ErrorCode
from corral.protocol.access import (
    ANY,
    AccessPolicy,
    RequestHead,
    check_access,
    check_content_type,
    is_loopback,
    normal_host,
    normal_origin,
    same_origin,
)

TOKEN = "access-token-123"


def head(
    method: str = "POST",
    *,
    loopback: bool = True,
    websocket: bool = False,
    **headers: str,
) -> RequestHead:
    pairs = [(name.replace("_", "-"), value) for name, value in headers.items()]
    local = "127.0.0.1" if loopback else "10.1.2.3"
    return RequestHead.of(
        method, "/reset", pairs, client="1.2.3.4", local=local, websocket=websocket
    )


def code_of(answer) -> str | None:
    return None if answer is None else str(answer.error.code)


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:8000", True),
        ("127.0.0.2", True),
        ("localhost:8000", True),
        ("LocalHost.", True),
        ("app.localhost:9", True),
        ("[::1]:8000", True),
        ("10.0.0.7:80", True),  # an IP literal: nothing to rebind
        ("evil.example:8000", False),
        ("localhost.evil.example", False),
        ("", False),
        ("a b", False),
    ],
)
def test_a_loopback_server_answers_only_names_no_one_can_point(host, allowed):
    answer = check_access(head("GET", host=host), AccessPolicy())
    assert (answer is None) is allowed
    if not allowed:
        assert answer.status == 403 and code_of(answer) == ErrorCode.FORBIDDEN
        assert answer.error.details["reason"] == "host"
        assert "allowed_hosts" in answer.error.details["fix"]


def test_allowed_hosts_add_names_and_then_bind_every_connection():
    policy = AccessPolicy.of(hosts=["Envs.Example.", "other.example"])
    assert check_access(head("GET", host="envs.example:443"), policy) is None
    assert check_access(head("GET", host="envs.example", loopback=False), policy) is None
    # Once a list is set it applies off loopback too.
    refused = check_access(head("GET", host="evil.example", loopback=False), policy)
    assert code_of(refused) == ErrorCode.FORBIDDEN
    # Without a list, a server reached off loopback answers any name (behind a proxy).
    assert check_access(head("GET", host="evil.example", loopback=False), AccessPolicy()) is None
    assert check_access(head("GET", host="evil.example"), AccessPolicy.of(hosts=[ANY])) is None


def test_a_request_without_host_or_with_two_hosts():
    assert check_access(head("GET"), AccessPolicy()) is None  # HTTP/1.0: no browser
    two = RequestHead.of("GET", "/", [("host", "127.0.0.1"), ("host", "evil.example")])
    assert code_of(check_access(two, AccessPolicy())) == ErrorCode.FORBIDDEN


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),  # not a browser
        ("http://127.0.0.1:8000", True),  # the server's own page
        ("HTTP://127.0.0.1:8000/", True),
        ("http://127.0.0.1:8001", False),  # another port is another origin
        ("http://localhost:8000", False),  # another host name too
        ("https://evil.example", False),
        ("null", False),  # a sandboxed or file: page
        ("not an origin", False),
    ],
)
def test_browser_pages_of_other_origins_are_refused(origin, allowed):
    extra = {} if origin is None else {"origin": origin}
    for method, websocket in (("POST", False), ("DELETE", False), ("GET", True)):
        answer = check_access(
            head(method, websocket=websocket, host="127.0.0.1:8000", **extra), AccessPolicy()
        )
        assert (answer is None) is allowed, (method, origin)
        if not allowed:
            assert answer.status == 403 and answer.error.details["reason"] == "origin"
    # Reading is not changing: a GET may come from anywhere (a page cannot read the reply).
    assert check_access(head("GET", host="127.0.0.1:8000", **extra), AccessPolicy()) is None


def test_allowed_origins_and_default_ports():
    policy = AccessPolicy.of(origins=["https://ui.example:443", "http://127.0.0.1:3000"])
    assert policy.origins == {"https://ui.example", "http://127.0.0.1:3000"}
    ok = head(host="127.0.0.1:8000", origin="https://ui.example")
    assert check_access(ok, policy) is None
    assert check_access(head(host="127.0.0.1:8000", origin="http://127.0.0.1:3000"), policy) is None
    assert check_access(head(host="127.0.0.1:8000", origin="http://127.0.0.1:3001"), policy)
    anywhere = head(host="x.example", origin="https://y.example", loopback=False)
    assert check_access(anywhere, AccessPolicy.of(origins=[ANY])) is None
    # Behind a TLS proxy that keeps Host, the public page is the server's own.
    assert same_origin("https://envs.example", "envs.example")
    assert same_origin("https://envs.example", "envs.example:443")
    assert not same_origin("http://envs.example", "envs.example:443")
    two = RequestHead.of(
        "POST", "/", [("host", "a"), ("origin", "http://a"), ("origin", "http://a")]
    )
    assert code_of(check_access(two, AccessPolicy())) == ErrorCode.FORBIDDEN
    for bad in ("ui.example", "https://ui.example/path", "https://", "ftp//x"):
        with pytest.raises(ValueError, match="not an origin"):
            normal_origin(bad)
    for bad in ("", "a:80", "http://a", "a/b"):
        with pytest.raises(ValueError, match="not a host name"):
            normal_host(bad)


def test_credentials_take_exactly_one_bearer_header():
    policy = AccessPolicy(TOKEN)
    right, wrong = f"Bearer {TOKEN}", "Bearer wrong-token-000"
    assert check_access(head(host="127.0.0.1", authorization=right), policy) is None
    missing = check_access(head(host="127.0.0.1"), policy)
    assert missing.status == 401 and code_of(missing) == ErrorCode.UNAUTHORIZED
    assert dict(missing.headers)["WWW-Authenticate"].startswith("Bearer")
    assert "requires a bearer token" in missing.error.message
    assert (
        "wrong" in check_access(head(host="127.0.0.1", authorization=wrong), policy).error.message
    )
    # Two headers are refused whichever comes last (it used to be "the last one wins").
    for pair in ((wrong, right), (right, wrong), (right, right)):
        doubled = RequestHead.of(
            "GET",
            "/",
            [("host", "127.0.0.1"), ("Authorization", pair[0]), ("authorization", pair[1])],
        )
        refused = check_access(doubled, policy)
        assert code_of(refused) == ErrorCode.UNAUTHORIZED
        assert "more than one" in refused.error.message
    # Public paths skip credentials, not the Host and Origin rules.
    assert check_access(head("GET", host="127.0.0.1"), policy, public=True) is None
    foreign = head(host="127.0.0.1", origin="http://evil.example")
    assert code_of(check_access(foreign, policy, public=True)) == ErrorCode.FORBIDDEN


def test_the_cookie_counts_only_from_the_servers_own_origin():
    policy = AccessPolicy(TOKEN, cookies=True)
    cookie = f"x=1; {COOKIE_NAME}={issue_cookie(TOKEN)}"
    mine = head(
        "GET", websocket=True, host="127.0.0.1:8000", origin="http://127.0.0.1:8000", cookie=cookie
    )
    assert check_access(mine, policy) is None
    assert check_access(mine, AccessPolicy(TOKEN)) is not None  # cookies off
    # Another origin is refused before the cookie is even looked at.
    theirs = head(
        "GET", websocket=True, host="127.0.0.1:8000", origin="http://evil.example", cookie=cookie
    )
    assert code_of(check_access(theirs, policy)) == ErrorCode.FORBIDDEN
    # Same-origin checks the cookie; a forged one is 401.
    forged = head("GET", websocket=True, host="127.0.0.1:8000", cookie=f"{COOKIE_NAME}=v1.9.aa.bb")
    assert code_of(check_access(forged, policy)) == ErrorCode.UNAUTHORIZED


@pytest.mark.parametrize(
    ("kind", "allowed"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/vnd.api+json", True),
        ("application/x-ndjson", True),
        ("text/plain", False),  # what a page posts without a preflight
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("application/msgpack", False),
        (None, False),
    ],
)
def test_a_state_changing_body_must_be_declared_json(kind, allowed):
    extra = {} if kind is None else {"content_type": kind}
    answer = check_content_type(head(host="127.0.0.1", content_length="2", **extra))
    assert (answer is None) is allowed
    if not allowed:
        assert answer.status == 415 and code_of(answer) == ErrorCode.BAD_FRAME
    chunked = head(host="127.0.0.1", transfer_encoding="chunked", **extra)
    assert (check_content_type(chunked) is None) is allowed


def test_no_body_or_no_change_needs_no_content_type():
    assert check_content_type(head(host="127.0.0.1")) is None
    assert check_content_type(head(host="127.0.0.1", content_length="0")) is None
    assert check_content_type(head("GET", content_length="5", content_type="text/plain")) is None
    two = RequestHead.of(
        "POST",
        "/",
        [
            ("content-length", "2"),
            ("content-type", "application/json"),
            ("content-type", "text/plain"),
        ],
    )
    assert check_content_type(two) is not None


def test_loopback_addresses():
    for address in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(address), address
    for address in (None, "", "10.0.0.1", "::ffff:10.0.0.1", "localhost", "fe80::1%eth0"):
        assert not is_loopback(address), address


def test_a_refusal_renders_as_the_protocols_error_and_a_close_code():
    refused = check_access(head(host="evil.example"), AccessPolicy())
    wire = refused.wire()
    assert wire["type"] == "error" and wire["code"] == "FORBIDDEN" and wire["id"] is None
    assert refused.close_code == 1008
    huge = check_access(head(host="evil.example", origin="http://" + "e" * 100_000), AccessPolicy())
    assert len(str(huge.wire())) < 2048  # what it echoes is bounded
