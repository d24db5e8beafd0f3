"""``python -m benchmarks.openenv_coding_server --port-file F``: OpenEnv's own ``coding_env``.

Run by an interpreter where OpenEnv's ``coding_env`` package imports (its virtualenv, with
``smolagents``; see :mod:`benchmarks.sandboxed`): its FastAPI app under uvicorn, as its
README serves it, on a port picked by the OS and written to ``F`` once listening. It
imports nothing of corral.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import uvicorn


def main() -> None:
    """Parse the command line and serve until terminated."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()

    from coding_env.server.app import app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(f"http://127.0.0.1:{port}")
    os.replace(tmp, args.port_file)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
