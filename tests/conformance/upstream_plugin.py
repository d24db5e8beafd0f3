"""A pytest plugin: OpenEnv's own tests, their servers started by ``corral serve``.

OpenEnv's server-driving tests (``tests/envs/test_websockets.py``) start each
environment as ``python -m uvicorn <module>:app --host H --port P``; with this plugin
loaded (``pytest -p upstream_plugin``, this directory on the path) and
``$CORRAL_UPSTREAM_SERVER=corral`` that child is ``python -m corral serve <module>:app
--host H --port P`` instead, and nothing else of the tests changes.

In either mode (``openenv`` keeps OpenEnv's uvicorn) the server's output goes to
/dev/null instead of pipes the tests never read: on a loaded machine a server that misses
their 10 s start-up deadline made them read its stderr until it exited, which it never
did. Both servers are run alike, so the two runs stay comparable.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

_Popen = subprocess.Popen


def corral_argv(argv: Any) -> Any:
    """``argv`` with a uvicorn server of an app turned into ``corral serve`` of it."""
    if not isinstance(argv, (list, tuple)) or len(argv) < 4:
        return argv
    args = [str(a) for a in argv]
    if args[1:3] != ["-m", "uvicorn"]:
        return argv
    rest = args[3:]
    app = next((a for a in rest if ":" in a and not a.startswith("-")), None)
    if app is None:
        return argv
    options = [a for a in rest if a != app]
    return [args[0], "-m", "corral", "serve", app, *options]


def _is_server(argv: Any) -> bool:
    return isinstance(argv, (list, tuple)) and [str(a) for a in argv[1:3]] == ["-m", "uvicorn"]


class _ServerPopen(_Popen):  # type: ignore[type-arg]
    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        if _is_server(args):
            kwargs["stdout"] = kwargs["stderr"] = subprocess.DEVNULL
            if os.environ.get("CORRAL_UPSTREAM_SERVER") == "corral":
                args = corral_argv(args)
        super().__init__(args, *rest, **kwargs)


def pytest_configure(config: Any) -> None:
    subprocess.Popen = _ServerPopen  # type: ignore[misc]
