"""``corral validate``: static checks and a smoke test of an environment, or conformance
checks of a running server.

* :mod:`~corral.cli.validate.command`: the typer command;
* :mod:`~corral.cli.validate.report`: the report (checks, table, JSON);
* :mod:`~corral.cli.validate.local`: ``PATH``: static checks and the runtime smoke test;
* :mod:`~corral.cli.validate.remote`: ``--url``: the suites, run in order
  (:mod:`~corral.cli.validate.http_checks`, :mod:`~corral.cli.validate.openenv_checks`,
  :mod:`~corral.cli.validate.corral_checks`), on :mod:`~corral.cli.validate.checks`.

Only the command is imported with the package; the checks load when they run.
"""

from corral.cli.validate.command import validate_command

__all__ = ["validate_command"]
