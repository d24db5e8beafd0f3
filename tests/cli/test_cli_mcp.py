"""``corral mcp TARGET``: MCP over stdio, whatever standard input is (a file, /dev/null)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.cli import REPO

TICTACTOE = str(REPO / "examples" / "tictactoe")


def mcp(stdin: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    """``corral mcp TICTACTOE ARGS < stdin`` in a child process."""
    with open(stdin, "rb") as source:
        return subprocess.run(
            [sys.executable, "-m", "corral.cli.main", "mcp", TICTACTOE, *args],
            stdin=source,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )


def test_requests_from_a_file_are_answered_in_order(tmp_path: Path) -> None:
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "play", "arguments": {"row": 1, "col": 1}},
        },
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests) + "x" * 300 + "\n")
    done = mcp(path, "--seed", "4", "--tool-name", "play")
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r.get("id") for r in replies] == [1, 2, 3, None]
    assert [t["name"] for t in replies[1]["result"]["tools"]] == ["reset", "play"]
    played = replies[2]["result"]["structuredContent"]
    assert played["board"][1][1] == 1 and played["moves"] == 2
    assert replies[3]["error"]["code"] == -32700  # a line that is not JSON: a parse error


def test_an_empty_input_ends_the_server_at_once() -> None:
    done = mcp("/dev/null")
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


def test_a_tool_name_clash_is_a_usage_error(tmp_path: Path) -> None:
    done = mcp("/dev/null", "--tool-name", "reset")
    assert done.returncode == 2 and "reserved" in done.stderr
