"""``corral.progress.Activity``: a live line, a one-line summary, raw output with ``verbose``."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from corral.progress import Activity, compact_command

PIP = (
    "$ /venv/bin/python -m pip download --no-deps -q -d /ctx/wheels --only-binary=:all: "
    "--implementation cp --python-version 3.11 "
    + " ".join(f"--platform manylinux_2_{g}_x86_64" for g in range(36, 4, -1))
    + " --platform manylinux2014_x86_64 -r /ctx/pins.txt"
)
# What corral build's progress callback receives, in order (abridged from a real build).
BUILD = [
    "building the wheel of demo_env",
    "$ /venv/bin/python -m pip wheel --no-deps -q -w /ctx/wheels /env",
    "resolving dependencies for CPython 3.11 x86_64",
    PIP,
    "downloading 28 wheels",
    PIP,
    "build context ready in /ctx",
    "Step 1/18 : FROM corral-base:bookworm AS install",
    " ---> af153499041a",
    "Step 2/18 : LABEL org.corral.stage=install",
    "Step 18/18 : CMD python -m corral serve demo_env.env:DemoEnv",
    "Successfully built c0de4c16305e",
]


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    screen = Console(file=out, force_terminal=terminal, color_system=None, width=300)
    return screen, out


def test_off_a_terminal_the_title_and_the_summary_are_all_that_is_printed() -> None:
    screen, out = console(terminal=False)
    with Activity("building demo_env", console=screen) as activity:
        for line in BUILD:
            activity(line)
        activity.done("built corral-demo_env:0.1.0 in 83.0 s")
    assert out.getvalue().splitlines() == [
        "building demo_env …",
        "built corral-demo_env:0.1.0 in 83.0 s",
    ]
    assert activity.lines == len(BUILD)


def test_phases_and_docker_steps_drive_the_live_line() -> None:
    screen, _ = console(terminal=True)
    seen: list[tuple[str, float, float | None]] = []
    with Activity("building demo_env", console=screen) as activity:
        task = activity._progress.tasks[0]
        for line in BUILD:
            activity(line)
            seen.append((activity.phase, task.completed, task.total))
        activity.done("built")
    phases = [phase for phase, _, _ in seen]
    assert phases[0] == "building the wheel of demo_env"
    assert "downloading 28 wheels" in phases
    # "build context ready ..." is a detail of the current phase, not a phase of its own.
    assert "build context ready in /ctx" not in phases
    steps = [(done, total) for phase, done, total in seen if phase.startswith("docker build")]
    assert steps[0] == (0, 18) and steps[-1] == (17, 18)
    assert seen[BUILD.index("Step 2/18 : LABEL org.corral.stage=install")][0] == (
        "docker build: LABEL org.corral.stage=install"
    )


def test_verbose_prints_every_line_with_long_commands_shortened() -> None:
    screen, out = console(terminal=False)
    with Activity("building demo_env", console=screen, verbose=True) as activity:
        for line in BUILD:
            activity(line)
        activity.done("built")
    text = out.getvalue()
    for line in BUILD:
        if not line.startswith("$ "):
            assert line.strip() in text
    assert text.count("--platform manylinux") == 2  # once per pip command, not 33 times
    assert "(33 times --platform)" in text


def test_compact_command_keeps_short_repetitions() -> None:
    assert compact_command("pip --abi cp311 --abi abi3 --abi none") == (
        "pip --abi cp311 --abi abi3 --abi none"
    )
    long = "x " + " ".join(f"--platform p{i}" for i in range(5)) + " -r req.txt"
    assert compact_command(long) == "x --platform p0 … (5 times --platform) -r req.txt"


def test_counted_work_and_lines_from_other_threads() -> None:
    screen, out = console(terminal=True)
    with Activity("starting 4 spares", console=screen, total=4) as activity:
        workers = [threading.Thread(target=activity, args=(f"line {i}",)) for i in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
            activity.advance()
        task = activity._progress.tasks[0]
        assert (task.completed, task.total, activity.lines) == (4, 4, 4)
        activity.done("4 spares ready in 1.0 s")
    assert out.getvalue().rstrip().endswith("4 spares ready in 1.0 s")
