"""The sans-I/O core of ``corral/1``: codecs, messages, batches, handshake, sessions.

Nothing here touches a socket, an event loop or a web framework; the server, the
client and any third-party transport all drive these pure functions and classes:
:mod:`~corral.protocol.messages` (the one message table, both directions),
:mod:`~corral.protocol.server` (a server connection: frames in, events and frames out),
:mod:`~corral.protocol.session` (one session's lifecycle table, reply cache and
``admit``), :mod:`~corral.protocol.registry` (the server's sessions) and
:mod:`~corral.protocol.client` (a client connection's state table, with its request
tracker, :mod:`~corral.protocol.client_requests`, and session book,
:mod:`~corral.protocol.client_sessions`).
"""

from corral.protocol.batch import BatchRequest, ResetBatch, StepBatch
from corral.protocol.client import ClientProtocol
from corral.protocol.client_requests import RequestTracker
from corral.protocol.client_sessions import SessionBook
from corral.protocol.codecs import PROTOCOL, Codec, JsonCodec, MsgpackCodec, get_codec
from corral.protocol.handshake import Compat, negotiate
from corral.protocol.messages import REPLIES, REQUESTS, parse_reply, parse_request
from corral.protocol.position import Phase
from corral.protocol.registry import SessionRegistry
from corral.protocol.server import ServerConnection
from corral.protocol.session import Op, ReplyCache, SessionMachine, SessionState

__all__ = [
    "PROTOCOL",
    "REPLIES",
    "REQUESTS",
    "BatchRequest",
    "ClientProtocol",
    "Codec",
    "Compat",
    "JsonCodec",
    "MsgpackCodec",
    "Op",
    "Phase",
    "ReplyCache",
    "RequestTracker",
    "ResetBatch",
    "ServerConnection",
    "SessionBook",
    "SessionMachine",
    "SessionRegistry",
    "SessionState",
    "StepBatch",
    "get_codec",
    "negotiate",
    "parse_reply",
    "parse_request",
]
