"""The sans-I/O core of ``corral/1``: codecs, messages, batches, handshake, lifecycle.

Nothing here touches a socket, an event loop or a web framework; the server, the
client and any third-party transport all drive these pure functions and classes.
"""

from corral.protocol.batch import BatchRequest, ResetBatch, StepBatch
from corral.protocol.client import ClientProtocol, RequestTracker, SessionBook
from corral.protocol.codecs import PROTOCOL, Codec, JsonCodec, MsgpackCodec, get_codec
from corral.protocol.handshake import Compat, negotiate
from corral.protocol.session import Op, Phase, ReplyCache, SessionMachine

__all__ = [
    "PROTOCOL",
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
    "SessionBook",
    "SessionMachine",
    "StepBatch",
    "get_codec",
    "negotiate",
]
