"""A page on another origin, in a real Chromium, cannot drive a corral server (issue 30.6).

The attacker's page is served by a second server on 127.0.0.1 (another port: another
origin). It tries what a malicious page can do without any token on a loopback server:
open a ``corral/1`` WebSocket, and post bodies a browser sends without a CORS preflight
(``text/plain``, no content type at all) to the routes that open and reset sessions. The
same page against a server that lists its origin in ``allowed_origins`` does get in —
the control showing the refusal is the Origin rule's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("playwright")

from tests.support.servers import running

from corral.envs.echo import EchoEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

PAGE = b"<!doctype html><title>a page elsewhere</title><p>nothing to see"

ATTACK = """async (target) => {
  const socket = await new Promise((resolve) => {
    const ws = new WebSocket(target.replace('http:', 'ws:') + '/ws', 'corral.v1.json');
    ws.onopen = () => {
      ws.send(JSON.stringify({type: 'hello', id: 1, protocol: 'corral/1'}));
      ws.send(JSON.stringify({type: 'open', id: 2}));
      ws.onmessage = (event) => {
        const reply = JSON.parse(event.data);
        if (reply.type === 'opened') resolve('opened a session');
      };
    };
    ws.onerror = () => resolve('refused');
    setTimeout(() => resolve('timed out'), 15000);
  });
  const posts = [
    ['/reset', {'Content-Type': 'text/plain'}, '{}'],
    ['/sessions', {}, undefined],
    ['/mcp', {'Content-Type': 'text/plain'},
     JSON.stringify({jsonrpc: '2.0', id: 1, method: 'openenv/session/create', params: {}})],
  ];
  for (const [path, headers, body] of posts) {
    await fetch(target + path, {method: 'POST', mode: 'no-cors', headers, body}).catch(() => null);
  }
  return socket;
}"""


@contextmanager
def another_origin() -> Iterator[str]:
    """A plain web server on another port of 127.0.0.1 serving an innocent-looking page."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


async def test_a_page_elsewhere_cannot_open_sessions_or_post(context):
    ctx, _ = context
    with another_origin() as elsewhere:
        page = await ctx.new_page()
        await page.goto(elsewhere + "/")
        with running(EchoEnv) as victim:
            outcome = await page.evaluate(ATTACK, victim.url)
            stats = victim.manager.stats
            assert outcome == "refused"
            assert (stats.opened, stats.resets, victim.manager.active) == (0, 0, 0)
            # The WebSocket and the three posts were refused for their origin.
            assert stats.errors.get("FORBIDDEN", 0) == 4, stats.errors
        # The control: a server that lists this origin lets the same page in.
        with running(EchoEnv, allowed_origins=(elsewhere,)) as trusting:
            outcome = await page.evaluate(ATTACK, trusting.url)
            assert outcome == "opened a session"
            assert trusting.manager.stats.errors.get("FORBIDDEN", 0) == 0


REBIND = """async () => {
  const answers = {};
  for (const [path, init] of [
    ['/schema', {}],
    ['/reset', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'}],
  ]) {
    const response = await fetch(path, init);
    answers[path] = [response.status, (await response.json()).code];
  }
  return answers;
}"""


async def test_a_rebound_name_reaches_the_server_and_is_refused(browser):
    """DNS rebinding for real: the browser resolves ``rebind.test`` to 127.0.0.1 (as an
    attacker's DNS would after serving the page), so the page's same-origin requests land
    on the loopback server — which answers only names no one else can point."""
    from tests.server.web.conftest import ARGS, CHROMIUM

    with running(EchoEnv) as victim:
        port = victim.url.rsplit(":", 1)[1]
        origin = f"http://rebind.test:{port}"
        rebinding = await browser.browser_type.launch(
            executable_path=CHROMIUM,
            args=[
                *ARGS,
                "--host-resolver-rules=MAP rebind.test 127.0.0.1",
                # As a browser without Local Network Access checks (Firefox, Safari, older
                # Chromium): the server must refuse on its own.
                "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests",
            ],
        )
        try:
            page = await rebinding.new_page()
            # The attacker's first answer: its page (served here without touching the network).
            await page.route(
                origin + "/", lambda route: route.fulfill(body=PAGE, content_type="text/html")
            )
            await page.goto(origin + "/")
            answers = await page.evaluate(REBIND)
        finally:
            await rebinding.close()
        assert answers == {"/schema": [403, "FORBIDDEN"], "/reset": [403, "FORBIDDEN"]}
        assert victim.manager.stats.resets == 0
