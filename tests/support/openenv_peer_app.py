"""A real openenv-core server (``create_app``) for ``CountEnv``, run as a child process.

    python tests/support/openenv_peer_app.py URL_FILE [MAX_CONCURRENT_ENVS]

Binds 127.0.0.1 port 0 itself, writes its URL to URL_FILE (atomically), then runs
uvicorn on that socket: no port races.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvicorn
from openenv.core.env_server.http_server import create_app
from tests.support.openenv_envs import CountAction, CountEnv, CountObservation


def main() -> None:
    url_file = Path(sys.argv[1])
    max_envs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    app = create_app(
        CountEnv, CountAction, CountObservation, env_name="count", max_concurrent_envs=max_envs
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    tmp = url_file.with_suffix(".tmp")
    tmp.write_text(f"http://127.0.0.1:{sock.getsockname()[1]}")
    os.replace(tmp, url_file)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
