"""A fake Hugging Face Hub for tests: an HTTP server on 127.0.0.1.

It answers the routes huggingface_hub's real client uses to create a Space and commit a
folder (``/api/repos/create``, ``/api/validate-yaml``, ``.../preupload/...``,
``.../commit/...``), validates README front matter as the Hub does for Spaces, and
records every request so that tests can check exactly what the client sent.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

# The Hub's own list, written out independently of corral's.
HUB_COLORS = ("red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray")


@dataclass
class Recorded:
    """One request the fake Hub received (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def ndjson(self) -> list[Any]:
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


def space_front_matter_errors(readme: str) -> list[str]:
    """What the Hub checks in a Docker Space's README metadata."""
    if not readme.startswith("---\n"):
        return ["README.md has no YAML front matter"]
    meta = yaml.safe_load(readme.split("---\n", 2)[1])
    errors = []
    if meta.get("sdk") not in ("gradio", "streamlit", "docker", "static"):
        errors.append(f'"sdk" must be one of gradio, streamlit, docker, static: {meta.get("sdk")}')
    if "app_port" in meta and not isinstance(meta["app_port"], int):
        errors.append('"app_port" must be a number')
    for key in ("colorFrom", "colorTo"):
        if key in meta and meta[key] not in HUB_COLORS:
            errors.append(f'"{key}" must be one of {HUB_COLORS}')
    if not isinstance(meta.get("title", ""), str) or not isinstance(meta.get("tags", []), list):
        errors.append('"title" must be a string and "tags" a list')
    return errors


@dataclass
class FakeHub:
    """The fake Hub's address, the requests it received and the Spaces it holds."""

    url: str
    requests: list[Recorded] = field(default_factory=list)
    existing: set[str] = field(default_factory=set)

    def of(self, suffix: str) -> list[Recorded]:
        """The requests whose path contains ``suffix``."""
        return [r for r in self.requests if r.path.endswith(suffix) or suffix in r.path]


@contextlib.contextmanager
def running_fake_hub(token: str = "hf_test_token") -> Iterator[FakeHub]:
    """Serve a fake Hub on 127.0.0.1 that accepts ``token``; yields its recorder."""
    hub = FakeHub(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            hub.requests.append(
                Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            status, reply = self.route(body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def route(self, body: bytes) -> tuple[int, Any]:
            if self.headers.get("Authorization") != f"Bearer {token}":
                return 401, {"error": "Invalid credentials in Authorization header"}
            if self.path == "/api/repos/create":
                payload = json.loads(body)
                repo = f"{payload['organization']}/{payload['name']}"
                if repo in hub.existing:
                    return 409, {
                        "error": "You already created this space repo",
                        "url": f"{hub.url}/spaces/{repo}",
                    }
                hub.existing.add(repo)
                return 200, {"url": f"{hub.url}/spaces/{repo}"}
            if self.path == "/api/validate-yaml":
                errors = space_front_matter_errors(json.loads(body)["content"])
                if errors:
                    return 400, {"errors": [{"message": e} for e in errors]}
                return 200, {}
            if self.path.startswith("/api/spaces/") and "/preupload/" in self.path:
                files = json.loads(body)["files"]
                return 200, {
                    "files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in files
                    ]
                }
            if self.path.startswith("/api/spaces/") and "/commit/" in self.path:
                repo = self.path.split("/api/spaces/", 1)[1].split("/commit/", 1)[0]
                return 200, {
                    "commitUrl": f"{hub.url}/spaces/{repo}/commit/c0ffee",
                    "commitOid": "c0ffee" * 6 + "c0ff",
                    "pullRequestUrl": None,
                }
            return 404, {"error": f"no route {self.path}"}

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
