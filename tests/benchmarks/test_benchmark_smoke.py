"""The benchmark suite at smoke sizes, so that it cannot rot (no timing assertions)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [
    "## 0. In-process ceiling",
    "## 1. Lockstep, one session",
    "## 2. Batched throughput",
    "## 3. Scale",
    "## 4. 84x84x3 uint8 observation",
    "## 5. Start-up",
    "## 6. PPO on 8 CartPole environments",
    "## 7. Sandboxed code execution",
    "## 8. Many slow sessions",
    "## 9. Density",
    "## 10. Sessions that outlive their server",
    "## Targets",
]


def _rows(markdown: str, section: str) -> list[list[str]]:
    body = markdown.split(section, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in body.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def _number(cell: str) -> float:
    return float(re.sub(r"[^0-9.]", "", cell))


def _smoke(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks --smoke ARGS`` from the repository, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_smoke_run_writes_every_table(tmp_path):
    output = tmp_path / "RESULTS.md"
    run = _smoke("--output", str(output), timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = output.read_text()
    assert "- Command: `python -m benchmarks --smoke --output" in report
    assert "- Machine:" in report and "- Packages: corral" in report
    for section in SECTIONS:
        assert section in report, section
    lockstep = {row[0]: row for row in _rows(report, SECTIONS[1])}
    names = (
        "corral msgpack",
        "corral msgpack, sync twin",
        "corral JSON",
        "corral msgpack, async env",
        "corral msgpack, websockets client",
        "corral msgpack, asyncio client",
        "websockets floor",
        "picows floor",
    )
    for name in names:
        assert _number(lockstep[name][3]) > 0  # steps/s
        assert _number(lockstep[name][1]) <= _number(lockstep[name][2])  # p50 <= p99
    ceiling = {row[0]: row for row in _rows(report, SECTIONS[0])}
    assert _number(ceiling["`EchoEnv.step`, one env"][1]) > 0
    assert _number(ceiling["Gymnasium `SyncVectorEnv`, 16 CartPole-v1"][1]) > 0
    for records in (0, 16, 32):  # the cache cliff, at the smoke sizes 4 and 16
        for sessions in (4, 16):
            row = ceiling[f"{sessions} `EchoEnv`, each visit touching {records} records"]
            assert _number(row[1]) > 0
    assert "16 vs 4 sessions: k = 0: " in report
    batched = _rows(report, SECTIONS[2])
    assert [row[0] for row in batched] == ["1", "16"]
    assert all(_number(cell) > 0 for row in batched for cell in row[1:4])  # three modes
    assert "Soak:" in report and "client RSS" in report
    assert report.count("Load average (1 min) during this section") == 11
    fleet = {row[0]: row for row in _rows(report, SECTIONS[10])}
    assert _number(fleet["snapshot / restore, echo"][1]) > 0
    assert _number(fleet["fork of 64 from one state, by replay"][1]) > 0
    assert "0 truncated" in report  # the rolling restart moved every session
    scale = {row[0]: row for row in _rows(report, SECTIONS[3])}
    assert _number(scale["corral"][1]) == 200 and _number(scale["corral"][3]) > 0
    payload = {row[0]: row for row in _rows(report, SECTIONS[4])}
    assert _number(payload["corral msgpack"][1]) > 0
    startup = {row[0]: row for row in _rows(report, SECTIONS[5])}
    assert 0 < _number(startup["corral"][1]) < 120
    assert 0 < _number(startup["corral, warm start"][1]) < 120
    assert 0 < _number(startup["corral, fresh script"][1]) < 120
    if importlib.util.find_spec("openenv") is not None:
        assert _number(lockstep["openenv-core"][3]) > 0
        assert _number(payload["openenv-core"][1]) > 0
        assert scale["openenv-core"][1] != "—"
    ppo = {row[0]: row for row in _rows(report, SECTIONS[6])}
    assert _number(ppo["local DummyVecEnv"][1]) > 0
    assert _number(ppo["corral RemoteVecEnv"][1]) > 0
    assert _number(ppo["local + one bare round trip per step (bound)"][1]) > 0
    assert _number(ppo["SB3 SubprocVecEnv (8 processes)"][1]) > 0
    assert _number(ppo["Gymnasium AsyncVectorEnv (8 processes, as an SB3 VecEnv)"][1]) > 0
    assert "For 0.8x a remote vec step may cost at most" in report
    assert "The bound's vec step costs" in report
    sandbox = {row[0]: row for row in _rows(report, SECTIONS[7])}
    warm = sandbox["corral, warm sandboxes (in process)"]
    assert _number(warm[1]) > 0 and 0 < _number(warm[2]) <= _number(warm[3])  # reset, step
    assert _number(sandbox["corral, served, 4 sessions"][4]) > 0  # sandboxed steps/s
    assert _number(sandbox["bare `python -c` per step"][2]) > 0
    if "docker: not measured here" not in report:
        assert _number(sandbox["`docker exec` into a running container"][2]) > 0
        assert _number(sandbox["`docker run --rm` per step"][2]) > 0
    slow = [row for row in _rows(report, SECTIONS[8]) if row[0].startswith("corral")]
    assert [row[0] for row in slow] == ["corral, own loops", "corral, lockstep rounds"]
    assert all(_number(row[1]) == 20 and _number(row[4]) >= 50 for row in slow)  # ≥ D
    if importlib.util.find_spec("openenv") is not None:
        assert "openenv-core at D = 0.05 s: the largest N" in report
    density = {row[0]: row for row in _rows(report, SECTIONS[9])}
    assert _number(density["sessions opened (`EnvPool.start()`), s"][1]) > 0
    assert _number(density["server RSS per session after the reset, KB"][1]) > 0
    assert _number(density["one more session in lockstep, step p99 µs"][1]) > 0
    targets = _rows(report, SECTIONS[-1])
    assert any(row[0].startswith("lockstep p50 within 1.3x") for row in targets)
    # The sync twin's ratio is one figure of one run, the two clients stepping in turns:
    # what the README's claim about the twin must quote.
    twin = next(row for row in targets if row[0].startswith("sync twin p50 within 1.2x"))
    assert _number(twin[1]) > 0
    assert "sync twin p50 / async client p50 = " in report
    assert any(row[0].startswith("stretch: pipelined") for row in targets)
    ppo_target = next(row for row in targets if row[0].startswith("PPO on 8 remote"))
    assert "(bound " in ppo_target[1]
    assert any(row[0].startswith("PPO: corral RemoteVecEnv ≥ 1.6x SB3") for row in targets)
    assert any(row[0].startswith("PPO: corral RemoteVecEnv ≥ 0.85x") for row in targets)
    for start in ("sandboxed step", "sandboxed reset", "≥ 150 sandboxed steps/s", "N = 20 slow"):
        assert any(row[0].startswith(start) for row in targets), start
    assert any(row[0].startswith("300 open echo sessions at ≤ 4 KB") for row in targets)
    flat = next(row for row in targets if row[0].startswith("flat from 256"))
    assert "(a bare loop touching 16 / 32 records per session: " in flat[1]
    assert all(row[2] in ("yes", "no", "—") for row in targets)


def test_unknown_sections_are_refused():
    run = _smoke("--only", "lockstep,warp", timeout=60)
    assert run.returncode == 2
    assert "unknown sections ['warp']" in run.stderr


def test_slow_cases_choose_section_8s_sizes(tmp_path):
    bad = _smoke("--only", "slow", "--slow-cases", "10x", timeout=60)
    assert bad.returncode == 2
    assert "--slow-cases takes NxD pairs" in bad.stderr
    report = tmp_path / "slow.md"
    run = _smoke(
        *("--only", "slow", "--no-openenv", "--slow-cases", "12x0.05", "--output", str(report)),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "N = 12 slow sessions at D = 0.05 s" in report.read_text()
