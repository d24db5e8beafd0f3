"""Stands in for gradio in the test processes: importing it fails.

Put first on the path of every test process by ``tests/conftest.py``, and on
``PYTHONPATH`` of the children it starts (the conformance suite's peer processes get it
from ``tests/conformance/venvs.peer_env``, which builds their path itself). OpenEnv
imports gradio only for its web interface (``openenv.core.env_server``'s
``from .web_interface import ...`` is guarded by ``except ModuleNotFoundError``, as for an
install without it), which these processes never enable (``ENABLE_WEB_INTERFACE`` unset).
Importing gradio cost ~4 s of CPU in each such process, three per conformance test (the
driver, OpenEnv's server and ``corral serve``), and in every xdist worker that ran a test
importing openenv: the most CPU of any part of the suite, for nothing any reply depends on.
"""

raise ModuleNotFoundError(
    "gradio is left out of the OpenEnv peers (tests/support/without_gradio)",
    name="gradio",
)
