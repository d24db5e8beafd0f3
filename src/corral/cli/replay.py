"""``corral replay FILE --url URL``: re-run recorded episodes and report divergences.

    corral replay runs/wordle/episodes.jsonl --url http://127.0.0.1:8000
    corral replay episodes.jsonl --env corral.envs.wordle:WordleEnv --ignore metadata.ms
    corral replay episodes.jsonl --env corral.envs.wordle:WordleEnv --pytest tests/test_regr.py

Exit status: 0 when every episode replayed identically (or was skipped), 1 when one
diverged or its replay failed, 2 when the file or the server could not be used. With
``--pytest`` nothing is replayed now: a pytest module that replays the episodes is
written (:mod:`corral.regression`); ``--url``/``--env`` become its defaults.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from corral.cli import console as cli_console
from corral.episodes import EpisodeFormatError, read
from corral.errors import CorralError
from corral.regression import pytest_module
from corral.replay import ReplayReport, replay


def replay_command(
    file: Annotated[Path, typer.Argument(help="The episode file (JSONL, or .jsonl.gz).")],
    url: Annotated[str | None, typer.Option("--url", help="The server to replay against.")] = None,
    env: Annotated[
        str | None,
        typer.Option(
            "--env", help="Start this environment (module:Class) in a local server instead."
        ),
    ] = None,
    ignore: Annotated[
        list[str] | None,
        typer.Option(
            "--ignore",
            help="An observation path left out of the comparison (repeatable; '*' matches "
            "any key or item), e.g. metadata.elapsed_ms.",
        ),
    ] = None,
    episode: Annotated[
        list[str] | None, typer.Option("--episode", help="Replay only this episode id.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes replayed at once.")] = 4,
    codec: Annotated[str, typer.Option(help="msgpack or json.")] = "msgpack",
    out: Annotated[
        Path | None, typer.Option("--out", help="Also record the replayed episodes here.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    pytest_out: Annotated[
        Path | None,
        typer.Option(
            "--pytest",
            help="Write a pytest module replaying the episodes to this file instead.",
        ),
    ] = None,
    token: Annotated[
        str | None, typer.Option(envvar="CORRAL_TOKEN", help="Bearer token for the server.")
    ] = None,
) -> None:
    """Re-run recorded episodes from their seeds, tasks and actions; report the first
    diverging observation of each."""
    if pytest_out is not None:
        _write_pytest(file, pytest_out, url, env, ignore or [], episode)
        return
    if (url is None) == (env is None):
        raise typer.BadParameter("give exactly one of --url and --env")
    try:
        report = asyncio.run(
            _run(file, url, env, ignore or [], episode, concurrency, codec, out, token)
        )
    except (EpisodeFormatError, OSError, CorralError, ValueError) as exc:
        raise cli_console.fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(report_json(report), indent=2))
    else:
        print_report(report, cli_console.output())
    raise typer.Exit(0 if report.ok else 1)


def _write_pytest(
    file: Path,
    out: Path,
    url: str | None,
    env: str | None,
    ignore: list[str],
    wanted: list[str] | None,
) -> None:
    console = cli_console.output()
    try:
        episodes = read(file)
        if wanted is not None:
            episodes = [e for e in episodes if e.id in set(wanted)]
        source = pytest_module(episodes, url=url, env=env, ignore=ignore, source=file.name)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(source)
    except (EpisodeFormatError, OSError, ValueError) as exc:
        raise cli_console.fail(str(exc)) from None
    console.print(f"wrote {escape(str(out))}: {len(episodes)} test(s); run it with pytest")


async def _run(
    file: Path,
    url: str | None,
    env: str | None,
    ignore: list[str],
    episodes: list[str] | None,
    concurrency: int,
    codec: str,
    out: Path | None,
    token: str | None,
) -> ReplayReport:
    server = None
    if env is not None:
        from corral.client.local_server import LocalServer

        server = LocalServer(env, token=token)
        url = await server.start()
    assert url is not None
    try:
        return await replay(
            file,
            url,
            ignore=ignore,
            episodes=episodes,
            concurrency=concurrency,
            codec=codec,
            token=token,
            out=out,
        )
    finally:
        if server is not None:
            await server.stop()


def print_report(report: ReplayReport, console: Console) -> None:
    """The report as a table of the episodes that did not replay identically, and totals."""
    if report.contract_changed:
        console.print(
            f"[yellow]warning:[/yellow] the server's contract {report.served_fingerprint} is "
            f"not the recording's {report.recorded_fingerprint}"
        )
    odd = [r for r in report.results if r.status != "identical"]
    if odd:
        table = Table("episode", "seed", "task", "status", "where", show_lines=False)
        for result in odd:
            episode = result.episode
            where = (
                f"{result.divergence.path}: recorded {result.divergence.expected!r}, "
                f"got {result.divergence.actual!r} (line {result.divergence.index})"
                if result.divergence is not None
                else result.note
            )
            table.add_row(
                escape(episode.id),
                str(episode.seed),
                str(episode.task or ""),
                result.status,
                escape(where[:200]),
            )
        console.print(table)
    counts = report.counts()
    summary = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    colour = "green" if report.ok else "red"
    console.print(f"[{colour}]{len(report.results)} episode(s): {summary or 'none'}[/{colour}]")


def report_json(report: ReplayReport) -> dict[str, Any]:
    """The report as plain JSON data."""
    return {
        "url": report.url,
        "ok": report.ok,
        "counts": report.counts(),
        "recorded_fingerprint": report.recorded_fingerprint,
        "served_fingerprint": report.served_fingerprint,
        "episodes": [
            {
                "episode": r.episode.id,
                "seed": r.episode.seed,
                "task": r.episode.task.model_dump() if r.episode.task else None,
                "status": r.status,
                "compared": r.compared,
                "note": r.note,
                "divergence": None
                if r.divergence is None
                else {
                    "index": r.divergence.index,
                    "op": r.divergence.op,
                    "path": r.divergence.path,
                    "expected": r.divergence.expected,
                    "actual": r.divergence.actual,
                },
            }
            for r in report.results
        ],
    }
