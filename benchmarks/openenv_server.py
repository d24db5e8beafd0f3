"""``python -m benchmarks.openenv_server KIND --port-file F``: an openenv-core server.

Serves the benchmark's openenv-core environment ``KIND`` (``echo``, ``async-echo`` or
``image``, or ``sleep``: its delay from ``$CORRAL_BENCH_DELAY``) with openenv-core's own
``create_app`` under uvicorn, on a port picked by the
OS and written to ``F`` once listening.
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
    parser.add_argument("kind", choices=["echo", "async-echo", "sleep", "image"])
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--max-sessions", type=int, default=1024)
    args = parser.parse_args()

    from openenv.core.env_server.http_server import create_app

    from benchmarks.envs import openenv_models

    env, action, observation = openenv_models()[args.kind]
    app = create_app(env, action, observation, max_concurrent_envs=args.max_sessions)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(65535)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="error", ws_max_size=64 * 1024 * 1024)
    server = uvicorn.Server(config)
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(f"http://127.0.0.1:{port}")
    os.replace(tmp, args.port_file)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
