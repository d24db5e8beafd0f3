"""An environment whose worker processes die while they start, on demand.

While the file named by ``$CORRAL_TEST_DIE_AT_START`` exists, importing this module
ends the process at once (exit code 3): a ``--workers`` server that imported it before
the file appeared keeps running, and each worker it starts from then on dies while
starting, as a worker would whose environment no longer imports (issue 30.5).
"""

from __future__ import annotations

import os

from tests.support.process_envs import PidEnv

FLAG = "CORRAL_TEST_DIE_AT_START"

_flag = os.environ.get(FLAG)
if _flag and os.path.exists(_flag):
    os._exit(3)


class StartingEnv(PidEnv):
    """:class:`PidEnv`, in a module that dies at import while the flag file exists."""
