"""corral: isolated, typed, remote environments for agentic reinforcement learning."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("corral")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
