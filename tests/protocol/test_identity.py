"""Server ids and the session ids that carry them (corral.protocol.identity)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.protocol.identity import (
    SEPARATOR,
    SERVER_ID,
    SessionIds,
    Where,
    default_server_id,
    server_of,
)


def test_a_session_id_names_its_server_and_verifies_here() -> None:
    ids = SessionIds("pod-0", b"fleet key")
    sid = ids.mint()
    assert sid.startswith("pod-0~") and sid.count(SEPARATOR) == 2
    assert server_of(sid) == "pod-0"
    found = ids.locate(sid)
    assert (found.where, found.server, found.verified) == (Where.HERE, "pod-0", True)
    assert ids.mint() != sid


def test_a_peer_of_the_fleet_is_told_where_and_a_forgery_is_unknown() -> None:
    mine, peer = SessionIds("pod-0", b"k"), SessionIds("pod-1", b"k")
    found = peer.locate(mine.mint())
    assert (found.where, found.server, found.verified) == (Where.ELSEWHERE, "pod-0", True)
    # Another fleet's id (another key), or a tag edited by hand: no redirect.
    stranger = SessionIds("pod-0", b"other key").mint()
    assert peer.locate(stranger).where is Where.UNKNOWN
    body, _, tag = mine.mint().rpartition(SEPARATOR)
    forged = f"{body}{SEPARATOR}{'0' * len(tag)}"
    assert peer.locate(forged).where is Where.UNKNOWN


def test_without_a_fleet_key_another_servers_id_is_a_hint() -> None:
    mine, peer = SessionIds("a"), SessionIds("b")
    found = peer.locate(mine.mint())
    assert (found.where, found.server, found.verified) == (Where.ELSEWHERE, "a", False)
    # Its own id from an earlier process (another key): still "here", unverified.
    again = SessionIds("a").locate(mine.mint())
    assert (again.where, again.verified) == (Where.HERE, False)


@pytest.mark.parametrize("text", ["", "abc", "a~b", "a~b~c~d", "bad id~x~y", "~x~y", "0" * 32])
def test_other_forms_are_unknown(text: str) -> None:
    assert SessionIds("s").locate(text).where is Where.UNKNOWN
    assert server_of(text) is None


@given(st.text(max_size=200))
def test_locate_never_raises(text: str) -> None:
    found = SessionIds("s", b"k").locate(text)
    assert found.where in set(Where)


def test_server_ids_are_checked_and_defaults_fit() -> None:
    with pytest.raises(ValueError, match="server id"):
        SessionIds("not ok")
    assert SERVER_ID.fullmatch(default_server_id(8000))
    assert default_server_id(8000).endswith("-8000")
    assert SERVER_ID.fullmatch(default_server_id())


def test_a_server_may_give_the_random_part_from_its_own_bulk_source() -> None:
    ids = SessionIds("pod-0", b"k")
    sid = ids.mint("ab" * 16)
    assert sid.split(SEPARATOR)[1] == "ab" * 16 and ids.locate(sid).verified
    for bad in ("ab" * 8, "AB" * 16, "zz" * 16, "ab~" * 11):
        with pytest.raises(ValueError, match="random part"):
            ids.mint(bad)
