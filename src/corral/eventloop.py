"""The event loop corral runs its own loops on: uvloop when installed, else asyncio's.

Install the ``fast`` extra (``pip install corral[fast]``) to get uvloop; set
``CORRAL_LOOP=asyncio`` to force the standard loop (e.g. to compare, or to debug).
Loops the caller owns (``asyncio.run`` in a trainer) are never replaced.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops: uvloop's if available and not disabled."""
    if os.environ.get("CORRAL_LOOP", "auto").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return factory
    return asyncio.new_event_loop


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: what :func:`loop_factory` builds."""
    return "asyncio" if loop_factory() is asyncio.new_event_loop else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Like ``asyncio.run`` but on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
