"""OpenEnv's own environments (its repository's ``envs/``), as the catalogue suite drives them.

Each entry names an environment of OpenEnv's ``envs/`` that installs from PyPI without
GPUs, model weights, data downloads or outside services, its three forms for
``corral serve``, and an episode its own client plays with a fixed seed. The sources are
read from a checkout of OpenEnv's repository named by ``$CORRAL_OPENENV_SRC`` (the
directory holding ``envs/`` and ``tests/``): they are published on PyPI only as part of
that repository, and corral's repository holds no third-party code (docs/openenv.md
says why). Out of scope, and why, in :data:`OUT_OF_SCOPE`.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMS = ("directory", "module:app", "module:Class")
"""The three forms of a target OpenEnv's documentation gives, in the table's order."""

RELEASES = ("openenv-core==0.3.0", "openenv==0.10.0")


@dataclass(frozen=True)
class CatalogEnv:
    """One environment of OpenEnv's ``envs/``.

    Attributes:
        name: its directory (and package) name.
        environment: its Environment class, ``module:Class`` inside the package.
        client: its own client class, ``module:Class`` inside the package.
        action: its action model, ``module:Class`` inside the package (None: an MCP
            environment, played with the client's ``list_tools``/``call_tool``).
        reset: the reset keywords of the episode (a fixed seed).
        actions: the episode's actions (the action model's fields; for an MCP
            environment ``[tool, arguments]`` pairs).
        requires: what it needs from PyPI besides OpenEnv.
        deterministic: the episode is the same for the same seed; else (an environment
            random by design) only its shape (keys, value types) is compared.
    """

    name: str
    environment: str
    client: str
    action: str | None
    reset: dict[str, Any]
    actions: list[Any]
    requires: tuple[str, ...] = field(default=())
    deterministic: bool = True

    def reference(self, form: str) -> str:
        """The ``corral serve`` target of ``form`` (the directory's is made absolute by
        the driver)."""
        if form == "directory":
            return self.name
        if form == "module:app":
            return f"{self.name}.server.app:app"
        return f"{self.name}.{self.environment}"


CATALOG: list[CatalogEnv] = [
    CatalogEnv(
        "echo_env",
        "server.echo_environment:EchoEnvironment",
        "client:EchoEnv",
        None,
        {"seed": 7},
        [["echo_message", {"message": "hi"}], ["echo_with_length", {"message": "corral"}]],
    ),
    CatalogEnv(
        "connect4_env",
        "server.connect4_environment:Connect4Environment",
        "client:Connect4Env",
        "models:Connect4Action",
        {"seed": 7},
        [{"column": 3}, {"column": 3}, {"column": 2}, {"column": 4}],
        ("numpy",),
    ),
    CatalogEnv(
        "grid_world_env",
        "server.grid_world_environment:GridWorldEnvironment",
        "client:GridWorldEnv",
        "models:GridWorldAction",
        {"seed": 7},
        [{"action": "RIGHT"}, {"action": "DOWN"}, {"action": "DOWN"}, {"action": "LEFT"}],
        ("numpy", "gymnasium"),
    ),
    CatalogEnv(
        "maze_env",
        "server.maze_env_environment:MazeEnvironment",
        "client:MazeEnv",
        "models:MazeAction",
        {"seed": 7},
        [{"action": 1}, {"action": 3}, {"action": 1}, {"action": 0}],
        ("numpy", "matplotlib"),
    ),
    CatalogEnv(
        "wildfire_env",
        "server.wildfire_environment:WildfireEnvironment",
        "client:WildfireEnv",
        "models:WildfireAction",
        {"seed": 7},
        [
            {"action": "wait"},
            {"action": "water", "x": 3, "y": 4},
            {"action": "break", "x": 5, "y": 5},
        ],
    ),
    CatalogEnv(
        "chess_env",
        "server.chess_environment:ChessEnvironment",
        "client:ChessEnv",
        "models:ChessAction",
        {"seed": 7},
        [{"move": "e2e4"}, {"move": "zz99"}, {"move": "g1f3"}],
        ("python-chess>=1.999", "moonfish>=0.0.1"),
        # The agent's colour is drawn from a fresh uuid at each reset, whatever the seed.
        deterministic=False,
    ),
    CatalogEnv(
        "coding_env",
        "server.python_codeact_env:PythonCodeActEnv",
        "client:CodingEnv",
        "models:CodeAction",
        {"seed": 7},
        [{"code": "print(1 + 1)"}, {"code": "x = 6\nprint(x * 7)"}, {"code": "1 / 0"}],
        ("smolagents",),
    ),
    CatalogEnv(
        "reasoning_gym_env",
        "server.reasoning_gym_environment:ReasoningGymEnvironment",
        "client:ReasoningGymEnv",
        "models:ReasoningGymAction",
        {"seed": 7, "dataset_name": "leg_counting", "dataset_config": {}, "size": 5},
        [{"answer": "4"}],
        ("reasoning-gym",),
    ),
]

OUT_OF_SCOPE: dict[str, str] = {
    "agent_world_model_env": "an LLM service (openai) and Hugging Face downloads",
    "atari_env": "ROM files",
    "browsergym_env": "a browser build and MiniWoB data",
    "calendar_env": "an outside calendar service",
    "carla_env": "the CARLA simulator (GPU)",
    "chat_env": "model weights (transformers tokenizer)",
    "coding_tools_env": "E2B, an outside sandbox service",
    "dipg_safety_env": "a data set download (openenv-dipg-safety on PyPI needs it)",
    "dm_control_env": "MuJoCo rendering",
    "finqa_env": "a data set download",
    "finrl_env": "market data downloads (yfinance, Alpaca)",
    "git_env": "a Gitea server",
    "julia_env": "a Julia installation",
    "jupyter_env": "E2B, an outside sandbox service",
    "kernrl": "a GPU (torch, triton)",
    "openapp_env": "a browser build and web apps",
    "opencode_env": "E2B and an LLM service",
    "openspiel_env": "OpenSpiel built from source",
    "repl_env": "an LLM service for its sub-calls, and gradio",
    "snake_env": "marlenv, which needs the retired gym package",
    "sumo_rl_env": "the SUMO simulator",
    "tbench2_env": "Docker images and an LLM service (camel-ai)",
    "terminus_env": "E2B, an outside sandbox service",
    "textarena_env": "NLTK data downloads",
    "unity_env": "Unity ML-Agents from git and its binaries",
    "websearch_env": "an outside search service",
}
"""OpenEnv's environments the suite does not run, and what each needs that this does not
allow (GPUs, model weights, data downloads, outside services)."""

UPSTREAM_TESTS = ("tests/envs/test_websockets.py",)
"""OpenEnv's own tests that drive its environments through a server, run against
``corral serve`` (their ``uvicorn <module>:app`` becomes ``corral serve <module>:app``)."""


def requirements() -> tuple[str, ...]:
    """What the catalogue's virtualenvs hold besides OpenEnv and corral's core."""
    found: list[str] = ["pytest", "requests"]
    for env in CATALOG:
        found.extend(r for r in env.requires if r not in found)
    return tuple(found)


def source() -> Path | None:
    """The OpenEnv checkout named by ``$CORRAL_OPENENV_SRC`` (None when unset)."""
    value = os.environ.get("CORRAL_OPENENV_SRC")
    if not value:
        return None
    root = Path(value)
    if not (root / "envs").is_dir():
        raise RuntimeError(f"$CORRAL_OPENENV_SRC={value} holds no envs/ directory")
    return root


RESULTS = Path(__file__).with_name("catalog_results.json")
"""The last catalogue run's outcome per release, environment and form (and OpenEnv's own
tests' counts), written by ``test_catalog.py``."""

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openenv.md"
_BEGIN = "<!-- catalogue table: made by `python -m tests.conformance.catalog` -->"
_END = "<!-- end of catalogue table -->"


def read_results() -> dict[str, Any]:
    """The recorded outcomes (empty before any run)."""
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def record(release: str, name: str, outcome: dict[str, Any]) -> None:
    """Record one environment's outcome (or ``upstream``'s counts) under ``release``."""
    with open(Path(tempfile.gettempdir()) / "corral-catalog-results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers record side by side
        results = read_results()
        results.setdefault(release, {})[name] = outcome
        ordered = {r: dict(sorted(results[r].items())) for r in sorted(results)}
        RESULTS.write_text(json.dumps(ordered, indent=1, sort_keys=True) + "\n")


def _cell(outcome: dict[str, Any] | None) -> str:
    if outcome is None:
        return "not run"
    status = str(outcome["status"])
    return {
        "equal": "equal",
        "refused": "refused, names the form that works",
        "openenv-fails": "fails alike under OpenEnv's server",
        "same-shape": "same shape (random by design)",
    }.get(status, status)


def _counts(counts: dict[str, int]) -> str:
    kinds = ("passed", "failed", "error", "skipped")
    return ", ".join(f"{counts.get(kind, 0)} {kind}" for kind in kinds)


def docs_table(results: dict[str, Any]) -> str:
    """The catalogue table of docs/openenv.md, between its markers."""
    short = {release: release.split("==")[1] for release in RELEASES}
    head = ["environment", *[f"{form} ({short[r]})" for r in RELEASES for form in FORMS]]
    lines = [_BEGIN, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for env in CATALOG:
        cells = [
            _cell(results.get(release, {}).get(env.name, {}).get(form))
            for release in RELEASES
            for form in FORMS
        ]
        lines.append(f"| `{env.name}` | " + " | ".join(cells) + " |")
    lines.append("")
    for release in RELEASES:
        upstream = results.get(release, {}).get("upstream")
        if upstream is None:
            continue
        lines.append(
            f"OpenEnv's own tests ({', '.join(UPSTREAM_TESTS)}), {release}: against "
            f"`corral serve` {_counts(upstream['corral'])}; against OpenEnv's server "
            f"{_counts(upstream['openenv'])}.  "
        )
    equal = sum(
        1
        for release in RELEASES
        for env in CATALOG
        for form in FORMS
        if results.get(release, {}).get(env.name, {}).get(form, {}).get("status")
        in ("equal", "same-shape")
    )
    total = len(RELEASES) * len(CATALOG) * len(FORMS)
    lines.append(f"Episodes as OpenEnv's server plays them: {equal} of {total}.")
    lines += ["", _END]
    return "\n".join(lines)


def write_docs() -> None:
    """Put the table of the recorded results into docs/openenv.md, between its markers."""
    text = DOCS.read_text()
    start, end = text.index(_BEGIN), text.index(_END) + len(_END)
    DOCS.write_text(text[:start] + docs_table(read_results()) + text[end:])


if __name__ == "__main__":
    write_docs()
