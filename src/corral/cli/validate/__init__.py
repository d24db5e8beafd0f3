"""``corral validate``: static checks and a smoke test of an environment, or conformance
checks of a running server.

* :mod:`~corral.cli.validate.command`: the typer command;
* :mod:`~corral.cli.validate.report`: the report (checks, table, JSON);
* :mod:`~corral.cli.validate.local`: ``PATH``: static checks and the runtime smoke test;
* :mod:`~corral.cli.validate.remote`: ``--url``: the suites, run in order
  (:mod:`~corral.cli.validate.http_checks`, :mod:`~corral.cli.validate.openenv_checks`,
  :mod:`~corral.cli.validate.corral_checks`), on :mod:`~corral.cli.validate.target`.
"""

from corral.cli.validate.command import validate_command
from corral.cli.validate.local import LocalOptions, validate_environment
from corral.cli.validate.remote import validate_url
from corral.cli.validate.report import Check, Report, Status

__all__ = [
    "Check",
    "LocalOptions",
    "Report",
    "Status",
    "validate_command",
    "validate_environment",
    "validate_url",
]
