"""``corral eval TARGET``: a policy over many episodes, with a progress bar and a summary.

    corral eval corral.envs.wordle:WordleEnv --policy scripted --split test --out runs/wl
    corral eval http://127.0.0.1:8000 --episodes 200 --concurrency 32 --policy my.agents:Greedy
    corral eval corral.envs.wordle:WordleEnv --policy llm --llm-url http://127.0.0.1:8001/v1 \\
        --model qwen2.5-7b --split test --out runs/wl-qwen

Running the same command again resumes the run in ``--out``; Ctrl-C says what was kept
and prints that command. Exit status: 0 when the run completed (whatever the policy
scored), 2 when it could not run, 130 when interrupted.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from corral.cli import console as cli_console
from corral.errors import CorralError


def eval_command(
    target: Annotated[
        str,
        typer.Argument(
            help="An environment directory, module:Class or gym:ID (started in local "
            "servers), a URL, or URLs separated by commas."
        ),
    ],
    episodes: Annotated[
        int | None,
        typer.Option(min=1, help="Episodes to play (default: the split's tasks, else 10)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Sessions playing at once.")] = 8,
    policy: Annotated[
        str,
        typer.Option(help="random, scripted, llm, or PATH:NAME (a function or class)."),
    ] = "random",
    split: Annotated[str | None, typer.Option(help="Play this split's tasks.")] = None,
    seed: Annotated[int, typer.Option(help="Episode k gets seed SEED + k.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(help="The run's directory (default: runs/<target>-<time>); resumed."),
    ] = None,
    retries: Annotated[int, typer.Option(min=0, help="Extra attempts of a failed episode.")] = 2,
    max_steps: Annotated[int, typer.Option(min=1, help="Truncate episodes at this many.")] = 100,
    servers: Annotated[
        int | None, typer.Option(min=1, help="Local servers to start (module:Class only).")
    ] = None,
    env: Annotated[
        str | None,
        typer.Option(
            "--env", help="The environment class (module:Class) for typed models and scripted."
        ),
    ] = None,
    llm_url: Annotated[
        str | None, typer.Option(help="An OpenAI-compatible endpoint (…/v1) for --policy llm.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="The model name for --policy llm.")] = None,
    llm_key_env: Annotated[
        str, typer.Option(help="The environment variable holding the endpoint's API key.")
    ] = "OPENAI_API_KEY",
    resume: Annotated[
        bool, typer.Option(help="Resume the run in --out (--no-resume: refuse to).")
    ] = True,
    parquet: Annotated[bool, typer.Option(help="Also write episodes.parquet.")] = False,
    dataset: Annotated[
        bool, typer.Option(help="Also save a Hugging Face dataset in <out>/dataset.")
    ] = False,
    codec: Annotated[str, typer.Option(help="msgpack or json.")] = "msgpack",
    token: Annotated[
        str | None, typer.Option(envvar="CORRAL_TOKEN", help="Bearer token for the servers.")
    ] = None,
    progress: Annotated[
        bool | None, typer.Option(help="Show a progress bar (default: on a terminal).")
    ] = None,
) -> None:
    """Evaluate a policy on an environment: N episodes, recorded, summarized."""
    # Imported here: the pool needs numpy, which every other corral command can skip.
    from corral.evaluation import EvalError, evaluate, summary_table

    console = cli_console.output()
    errors = cli_console.errors()
    where, env_class = _eval_target(target, env)
    run_dir = out or Path("runs") / f"{_slug(target)}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    try:
        summary = asyncio.run(
            evaluate(
                where,
                out=run_dir,
                policy=policy,
                episodes=episodes,
                concurrency=concurrency,
                split=split,
                seed=seed,
                retries=retries,
                max_steps=max_steps,
                env=env_class,
                servers=servers,
                llm_url=llm_url,
                model=model,
                llm_api_key=os.environ.get(llm_key_env),
                resume=resume,
                progress=progress,
                console=errors,
                codec=codec,
                token=token,
                parquet=parquet,
                dataset=dataset,
            )
        )
    except (EvalError, CorralError, OSError, ImportError) as exc:
        raise cli_console.fail(str(exc)) from None
    except KeyboardInterrupt:
        errors.print(f"resume with: {escape(_resume_command(run_dir))}")
        raise typer.Exit(130) from None
    console.print(summary_table(summary))
    console.print(f"episodes, settings and summary in {escape(str(run_dir))}/")


def _resume_command(run_dir: Path) -> str:
    """This command line, with ``--out`` naming the run (it may have been made up here)."""
    args = sys.argv[1:]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args = [*args, "--out", str(run_dir)]
    return shlex.join(["corral", *args])


def _eval_target(target: str, env: str | None) -> tuple[Any, Any]:
    """What the pool is given for TARGET (read by :mod:`corral.cli.target`'s rule), and
    the environment class for typed models (``--env``'s, else TARGET's when it names one).

    Raises:
        typer.BadParameter: TARGET or ``--env`` fits no form or cannot be loaded.
    """
    from corral.cli.target import TargetKind, read_target
    from corral.server.target import TargetError

    try:
        chosen = read_target(target, urls=True)
    except TargetError as exc:
        raise typer.BadParameter(str(exc), param_hint="TARGET") from None
    hint = "--env" if env is not None else "TARGET"
    try:
        # Imported here, from TARGET's directory: typed models, and a typo found before
        # any server starts.
        env_class = read_target(env).env_class() if env is not None else chosen.env_class()
    except TargetError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    if chosen.kind is TargetKind.URL:
        urls = chosen.urls
        return (urls if len(urls) > 1 else urls[0]), env_class
    return chosen.server_target, env_class


def _slug(target: str) -> str:
    name = target.rsplit(":", 1)[-1] if "://" not in target else target.split("://", 1)[1]
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-")[:40]
