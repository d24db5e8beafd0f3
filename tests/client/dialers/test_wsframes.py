"""RFC 6455 client framing without I/O: masking, the server's frames checked and reassembled,
the upgrade's request and answer."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable

import pytest
from tests.support.rawwsserver import close, frame

from corral.client.dialers.wsframes import (
    CloseFrame,
    FrameError,
    FrameReader,
    Masker,
    PingFrame,
    PongFrame,
    accept_for,
    check_upgrade,
    close_payload,
    dechunk,
    mask,
    read_head,
    upgrade_request,
    xor_mask,
)


def slow_mask(payload: bytes, key: bytes) -> bytes:
    return bytes(b ^ key[i % 4] for i, b in enumerate(payload))


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 125, 126, 1000, 65536, 100_003])
def test_mask_is_the_xor_with_the_repeated_key(size):
    payload = os.urandom(size)
    for key in (b"\x00\x00\x00\x00", b"\xff\x01\x80\x7f", os.urandom(4)):
        expected = slow_mask(payload, key)
        assert mask(payload, key) == expected  # websockets' C helper, when built
        assert xor_mask(payload, key) == expected  # the fallback
        assert mask(expected, key) == xor_mask(expected, key) == payload


def unframe(
    wire: bytes, unmask: Callable[[bytes, bytes], bytes] = slow_mask
) -> tuple[int, bytes, bytes]:
    """A client frame read back by hand: (first byte, key, payload unmasked by ``unmask``)."""
    second = wire[1]
    assert second & 0x80, "client frames must be masked"
    length, at = second & 0x7F, 2
    if length == 126:
        length, at = int.from_bytes(wire[2:4], "big"), 4
    elif length == 127:
        length, at = int.from_bytes(wire[2:10], "big"), 10
    key = wire[at : at + 4]
    payload = wire[at + 4 :]
    assert len(payload) == length
    return wire[0], key, unmask(payload, key)


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_client_frames_are_masked_with_a_fresh_key_each(size):
    masker = Masker()
    payload = os.urandom(size)
    keys = set()
    for k in range(600):  # past one block of pooled keys
        # The byte-by-byte reading once; then the fallback, checked against it above (a
        # byte loop over 600 frames of 64 KiB costs tens of seconds of CPU).
        first, key, data = unframe(masker.frame(0x2, payload), slow_mask if k == 0 else xor_mask)
        assert first == 0x82 and data == payload
        keys.add(key)
    assert len(keys) > 590  # 32 random bits: a repeat among 600 is a ~4e-5 event


def feed_all(reader: FrameReader, wire: bytes, step: int) -> list[object]:
    events: list[object] = []
    for k in range(0, len(wire), step):
        events += reader.feed(wire[k : k + step])
    return events


@pytest.mark.parametrize("step", [1, 2, 3, 7, 10_000])
def test_messages_in_any_split_with_control_frames_between_fragments(step):
    wire = b"".join(
        [
            frame(0x2, b"whole"),
            frame(0x2, b"ab", fin=False),
            frame(0x9, b"ping-1"),
            frame(0x0, b"cd", fin=False),
            frame(0xA, b"pong-1"),
            frame(0x0, b"ef"),
            frame(0x1, "h\u00e9".encode(), fin=False),
            frame(0x0, b"llo"),
            frame(0x2, b"x" * 300),
            frame(0x2, b"y" * 70_000),
            close(1001, "bye"),
            frame(0x2, b"after the close: ignored"),
        ]
    )
    reader = FrameReader(100_000)
    events = feed_all(reader, wire, step)
    assert events == [
        b"whole",
        PingFrame(b"ping-1"),
        PongFrame(b"pong-1"),
        b"abcdef",
        "h\u00e9llo",
        b"x" * 300,
        b"y" * 70_000,
        CloseFrame(1001, "bye"),
    ]
    assert reader.done and reader.failure is None
    assert reader.feed(frame(0x2, b"more")) == []


@pytest.mark.parametrize(
    ("wire", "code", "words"),
    [
        (bytes((0x82, 0x81)) + b"kkkk" + b"x", 1002, "masked"),
        (frame(0x2, b"x", rsv=4), 1002, "reserved bits"),
        (frame(0x3, b"x"), 1002, "unknown opcode"),
        (frame(0xB, b"x"), 1002, "unknown opcode"),
        (frame(0x9, b"x", fin=False), 1002, "control frame"),
        (frame(0x9, b"x" * 126), 1002, "control frame"),
        (frame(0x0, b"x"), 1002, "continuation frame without a start"),
        (frame(0x2, b"a", fin=False) + frame(0x2, b"b"), 1002, "inside a fragmented"),
        (frame(0x1, b"\xff\xfe"), 1007, "not UTF-8"),
        (frame(0x1, b"\xc3", fin=False) + frame(0x0, b"("), 1007, "not UTF-8"),
        (frame(0x8, b"\x03"), 1002, "1-byte"),
        (close(1005), 1002, "close code 1005"),
        (close(1006), 1002, "close code 1006"),
        (close(999), 1002, "close code 999"),
        (close(5000), 1002, "close code 5000"),
        (frame(0x8, b"\x03\xe8\xff"), 1007, "not UTF-8"),
        (bytes((0x82, 127)) + (1 << 63).to_bytes(8, "big"), 1002, "top bit"),
    ],
)
def test_protocol_violations_fail_with_their_close_code(wire, code, words):
    reader = FrameReader(1000)
    events = reader.feed(frame(0x2, b"before") + wire + frame(0x2, b"after"))
    assert events == [b"before"]  # what came before the violation is delivered
    assert reader.failure is not None and reader.done
    assert reader.failure.code == code and words in reader.failure.reason


def test_a_message_over_the_limit_is_refused_from_its_header():
    reader = FrameReader(1000)
    # The header alone announces 2,000 bytes: refused before any of them arrives.
    assert reader.feed(frame(0x2, b"z" * 2000)[:4]) == []
    assert reader.failure is not None and reader.failure.code == 1009
    reader = FrameReader(1000)
    events = reader.feed(frame(0x2, b"a" * 600, fin=False) + frame(0x0, b"b" * 401)[:4])
    assert events == [] and reader.failure is not None and reader.failure.code == 1009
    reader = FrameReader(1000)  # exactly the limit, fragments together: accepted
    assert reader.feed(frame(0x2, b"a" * 600, fin=False) + frame(0x0, b"b" * 400)) == [
        b"a" * 600 + b"b" * 400
    ]


@pytest.mark.parametrize("size", [2, 125, 126, 300, 65535])
def test_one_whole_binary_frame_per_read(size):
    reader = FrameReader(1000)
    wire = frame(0x2, b"m" * size)
    if size <= 1000:
        assert reader.feed(wire) == [b"m" * size]
        assert reader.feed(wire) == [b"m" * size] and reader.failure is None
    else:
        assert reader.feed(wire) == [] and reader.failure is not None
        assert reader.failure.code == 1009
    reader = FrameReader(1000)
    assert reader.feed(frame(0x2, b"a", fin=False)) == []  # a fragment pending: the loop
    assert reader.feed(frame(0x0, b"b")) == [b"ab"]


@pytest.mark.parametrize("code", [1000, 1001, 1003, 1007, 1011, 1014, 3000, 4999])
def test_close_codes_an_endpoint_may_send(code):
    assert FrameReader(10).feed(close(code, "why")) == [CloseFrame(code, "why")]


def test_an_empty_close_is_no_status():
    assert FrameReader(10).feed(frame(0x8)) == [CloseFrame(1005, "")]
    assert close_payload(1005) == b""
    assert close_payload(1000, "r" * 200) == b"\x03\xe8" + b"r" * 123


def test_the_upgrade_request_and_its_answer():
    key = base64.b64encode(b"k" * 16).decode()
    request = upgrade_request(
        "/ws?x=1", "[::1]:8000", key, {"X-Corral-Resume": "a,b", "Authorization": "Bearer t"}
    )
    lines = request.decode().split("\r\n")
    assert lines[0] == "GET /ws?x=1 HTTP/1.1"
    assert "Host: [::1]:8000" in lines and "Sec-WebSocket-Version: 13" in lines
    assert "X-Corral-Resume: a,b" in lines and "Authorization: Bearer t" in lines
    assert request.endswith(b"\r\n\r\n")
    for bad in ({"X": "a\r\nInjected: 1"}, {"Bad\nName": "v"}, {"Host": "elsewhere"}):
        with pytest.raises(ValueError):
            upgrade_request("/ws", "h", key, bad)
    with pytest.raises(ValueError, match="upgrade's own"):
        upgrade_request("/ws", "h", key, {"Sec-WebSocket-Extensions": "permessage-deflate"})

    expected = base64.b64encode(
        hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
    )
    assert accept_for(key) == expected.decode()
    head = read_head(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: keep-alive\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + expected + b"\r\n"
        b"Sec-WebSocket-Protocol: corral.v1.json"
    )
    assert head.status == 101 and head.headers["connection"] == "keep-alive, Upgrade"
    assert check_upgrade(head, key) == "corral.v1.json"
    wrong = read_head(
        b"HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: upgrade\r\n"
        b"Sec-WebSocket-Accept: AAAA"
    )
    with pytest.raises(FrameError, match="Accept"):
        check_upgrade(wrong, key)
    extended = read_head(
        b"HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: upgrade\r\n"
        b"Sec-WebSocket-Accept: " + expected + b"\r\nSec-WebSocket-Extensions: permessage-deflate"
    )
    with pytest.raises(FrameError, match="extension"):
        check_upgrade(extended, key)
    with pytest.raises(FrameError, match="not an HTTP answer"):
        read_head(b"SSH-2.0-OpenSSH_9.6")


def test_dechunk_waits_for_the_last_chunk():
    body = b"4\r\nWiki\r\n6;ext=1\r\npedia \r\n0\r\n\r\n"
    assert dechunk(body) == b"Wikipedia "
    for cut in range(len(body) - 4):
        assert dechunk(body[:cut]) is None
    assert dechunk(b"zz\r\n") == b""
