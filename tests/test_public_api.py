"""The public names of each package, pinned: adding or removing one is a decision.

Each package's ``__all__`` is exactly the list below, every name in it resolves, and the
package shows no other public name (submodules aside), so nothing leaks into the API by
an import. ``import corral`` stays cheap: the top-level names load on first use.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from types import ModuleType

import pytest

PUBLIC = {
    "corral": [
        "Action",
        "AsyncEnvClient",
        "CorralError",
        "EnvPool",
        "Environment",
        "Observation",
        "State",
        "StepResult",
        "SyncEnvClient",
        "__version__",
    ],
    "corral.client": [
        "AsyncEnvClient",
        "AutoresetMode",
        "EnvPool",
        "PoolBatch",
        "PoolError",
        "ReconnectPolicy",
        "SyncEnvClient",
        "SyncEnvPool",
    ],
    "corral.contract": [
        "Action",
        "Environment",
        "Observation",
        "Snapshot",
        "State",
        "StepResult",
        "WireModel",
        "WireSafetyError",
    ],
    "corral.server": ["ServerConfig", "create_app", "serve"],
    "corral.testing": [
        "URL",
        "InProcessHandle",
        "InProcessNetwork",
        "InProcessServer",
        "InProcessSocket",
    ],
    "corral.protocol": [
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
    ],
}


TYPING_HELPERS = {"annotations", "TYPE_CHECKING", "Any"}
"""Names a package's ``__init__`` imports for its own annotations."""


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_exported_members(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__, key=str.casefold) == sorted(PUBLIC[package], key=str.casefold)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name} does not resolve"
    if not hasattr(module, "__path__"):
        return  # a module's imports are its own business; a package's namespace is its API
    shown = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    stray = shown - set(module.__all__) - TYPING_HELPERS
    assert not stray, f"{package} shows names outside __all__: {sorted(stray)}"


def test_the_top_level_is_lazy() -> None:
    code = (
        "import sys, corral; "
        "heavy = [m for m in ('pydantic', 'numpy', 'websockets', 'corral.client') "
        "if m in sys.modules]; "
        "print(','.join(heavy)); "
        "corral.Environment; corral.AsyncEnvClient; "
        "print('numpy' in sys.modules, corral.EnvPool.__module__, 'numpy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == ""  # nothing heavy on `import corral`
    assert out[1] == "False corral.client.pool True"  # numpy with EnvPool only
