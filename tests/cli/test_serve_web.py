"""``corral serve --web``: the command the issue names gives the UI at ``/web``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def test_serve_wordle_with_the_web_ui(tmp_path):
    port_file = tmp_path / "url"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_TOKEN")}
    child = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", "corral.envs.wordle:WordleEnv", "--web",
         "--port", "0", "--port-file", str(port_file)],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        url = port_file.read_text()
        with httpx.Client(base_url=url, trust_env=False) as http:
            assert http.get("/").headers["location"] == "web/"
            page = http.get("/web/")
            assert page.status_code == 200 and "main.js" in page.text
            assert http.get("/render").json() == {"render_html": True, "web_actions": True}
            assert http.get("/status").json()["env"]["name"] == "wordle"
    finally:
        child.terminate()
        child.wait(10)
