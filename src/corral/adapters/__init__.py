"""Adapters to the libraries trainers already use; each needs its optional extra.

* :mod:`corral.adapters.gymnasium` (``corral[gymnasium]``): serve any Gymnasium
  environment, use a remote session as a ``gymnasium.Env``, N sessions as a ``VectorEnv``.
* :mod:`corral.adapters.trl` (``corral[trl]``): ``GRPOTrainer(environment_factory=...)``.
* :mod:`corral.adapters.mcp` (``corral[mcp]``): an environment's tools over MCP.
* :mod:`corral.adapters.openenv_env` (``corral[openenv]``): serve OpenEnv environment classes.
"""
