"""``corral validate --url``: black-box conformance checks of a running server.

The checks connect over HTTP and WebSocket, detect whether the server speaks
``corral/1``, OpenEnv's envelope or both, and run the suites that apply: the HTTP basics
(:mod:`~corral.cli.validate.http_checks`), OpenEnv's routes and envelope
(:mod:`~corral.cli.validate.openenv_checks`) and corral/1
(:mod:`~corral.cli.validate.corral_checks`). Replies are validated against the server's
own ``/schema``; a valid action is synthesized from the action schema
(:mod:`corral.contract.examples`) unless one is given.
"""

from __future__ import annotations

from typing import Any

import httpx

from corral.cli.validate.checks import CORRAL_SUBPROTOCOL
from corral.cli.validate.corral_checks import CorralChecks
from corral.cli.validate.http_checks import HttpChecks
from corral.cli.validate.openenv_checks import OpenEnvChecks
from corral.cli.validate.report import Report, Status


class Validator(HttpChecks, OpenEnvChecks, CorralChecks):
    """Runs the runtime checks against one server (see :func:`validate_url`)."""

    async def run(self) -> Report:
        """Run every applicable check and return the report."""
        async with httpx.AsyncClient(
            base_url=self.base, timeout=self.timeout, trust_env=False
        ) as http:
            self._http = http
            await self.run_http_checks()
            corral = await self.detect_corral()
            openenv = await self.detect_openenv()
            self.report.protocols = {"corral": corral, "openenv": openenv}
            if not (corral or openenv):
                self._record(
                    "detect",
                    "http",
                    "The server speaks corral/1 or OpenEnv on /ws",
                    Status.FAIL,
                    f"{self.ws_url} answered neither corral/1 (subprotocol {CORRAL_SUBPROTOCOL}) "
                    "nor OpenEnv's envelope",
                )
            if openenv:
                await self.run_openenv_http_checks()
                await self.run_openenv_ws_checks()
            if corral:
                await self.run_corral_checks()
        return self.report


async def validate_url(
    url: str,
    *,
    timeout: float = 5.0,
    action: dict[str, Any] | None = None,
    capacity_probe: int = 8,
) -> Report:
    """Run the runtime checks against the server at ``url`` and return the report.

    Args:
        url: the server's base URL (``http://host:port``).
        timeout: seconds to wait for any single reply.
        action: a valid action (else one is synthesized from the action schema).
        capacity_probe: check capacity only when the server holds at most this many
            sessions (opening that many is cheap enough).
    """
    return await Validator(url, timeout=timeout, action=action, capacity_probe=capacity_probe).run()
