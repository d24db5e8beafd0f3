"""A local VecEnv that also pays one bare round trip per step: the PPO section's bound.

A remote environment costs its trainer at least one round trip per vec step to a server
process, whatever the framework. :class:`BareRoundTrips` adds exactly that to a local
``DummyVecEnv``: each ``step_wait`` sends ``size`` bytes over a blocking TCP socket
to the ``tcp`` floor server (bytes echoed by an asyncio ``Protocol`` in its own process,
no WebSocket framing, no message decoding) and reads them back. PPO on it is the most any
server written in Python reaches on this machine; the gap between it and corral's
``RemoteVecEnv`` is what a framework costs.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn


class BareRoundTrips(VecEnvWrapper):
    """``venv``, plus one echo round trip of ``size`` bytes to ``url`` per step."""

    def __init__(self, venv: VecEnv, url: str, size: int) -> None:
        super().__init__(venv)
        where = urlsplit(url)
        assert where.hostname is not None and where.port is not None, url
        self._socket = socket.create_connection((where.hostname, where.port))
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._payload = bytes(size)
        self._buffer = bytearray(size)

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> VecEnvStepReturn:
        self._round_trip()
        return self.venv.step_wait()

    def close(self) -> None:
        self._socket.close()
        self.venv.close()

    def _round_trip(self) -> None:
        self._socket.sendall(self._payload)
        view = memoryview(self._buffer)
        got = 0
        while got < len(self._buffer):  # TCP may hand the echo back in pieces
            n = self._socket.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the echo server closed the connection")
            got += n
