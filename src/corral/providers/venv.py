"""Virtualenvs for environment servers, built from ``pyproject.toml`` and cached.

:func:`ensure_venv` gives an environment a virtualenv holding corral and the
environment's ``[project].dependencies``, and nothing else: a server started with its
interpreter sees exactly what the environment declares (a missing dependency fails
locally, not first in a Docker image). The environment's own code is not installed; the
server imports it from the environment's directory.

Virtualenvs are cached under :func:`venv_cache_dir`, keyed by a hash of the interpreter,
corral's build and the dependency list, so environments (and servers) with the same
dependencies share one, and it is built once. Builds of the same key are serialized
across processes with a file lock; a build that fails leaves nothing behind.

Offline-friendly: every wheel a build uses is kept in a wheelhouse next to the cache,
and a build first tries to install from it (and from pip's configured find-links) with
``--no-index``. Only what is missing is fetched from the package index, and with
``offline=True`` nothing is: a missing wheel is then an error that says what to add.
corral itself comes from its source tree's wheel (built once per source change, see
:func:`corral.providers.dockerfile.corral_wheel`) or, installed from a distribution, at
its own version.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import corral
from corral.progress import Activity
from corral.providers.dockerfile import BuildError, Progress, corral_wheel, run_step
from corral.providers.manifest import project_dependencies

MARKER = ".corral-venv.json"
"""Written last into a complete virtualenv; a directory without it is rebuilt."""


class VenvError(BuildError):
    """A virtualenv could not be built; the message has pip's last lines and the fix."""


@dataclass(frozen=True)
class EnvVenv:
    """A ready virtualenv for an environment.

    Attributes:
        path: the virtualenv's directory.
        python: its interpreter.
        key: the cache key (hash of interpreter, corral and dependencies).
        requirements: what was installed (corral first).
        reused: it existed already; nothing was built.
    """

    path: Path
    python: Path
    key: str
    requirements: tuple[str, ...]
    reused: bool


def venv_cache_dir() -> Path:
    """Where virtualenvs are cached: ``$CORRAL_VENV_CACHE``, else under ``$XDG_CACHE_HOME``."""
    explicit = os.environ.get("CORRAL_VENV_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "corral" / "venvs"


@functools.cache
def _interpreter_id(python: str) -> str:
    """What makes wheels of ``python`` differ: implementation, version, ABI, platform."""
    script = (
        "import platform, sys, sysconfig; "
        "print(sys.implementation.cache_tag, sys.version.split()[0], "
        "sysconfig.get_platform(), platform.machine(), sys.abiflags)"
    )
    try:
        out = subprocess.run(
            [python, "-I", "-c", script], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise VenvError(f"cannot run the interpreter {python!r}: {exc}") from None
    return out.strip()


def _base_python() -> str:
    """The interpreter new virtualenvs are made from (this one's base, not its venv)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if os.path.exists(base) else sys.executable


def _normalize(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def requirements_for(env_dir: str | Path, progress: Progress | None = None) -> list[str]:
    """corral (its source tree's wheel, or ``corral==VERSION``) and the environment's deps.

    Raises:
        ManifestError: ``pyproject.toml`` is invalid.
        BuildError: corral's wheel could not be built.
    """
    wheel = corral_wheel(progress=progress)
    corral_req = str(wheel) if wheel is not None else f"corral=={corral.__version__}"
    return [corral_req, *project_dependencies(env_dir)]


def venv_key(python: str, requirements: Sequence[str]) -> str:
    """The cache key of a virtualenv of ``python`` with ``requirements``."""
    payload = json.dumps(
        {
            "python": _interpreter_id(python),
            # corral's wheel path holds the hash of its sources; the rest is order-free.
            "corral": requirements[0] if requirements else "",
            "requirements": sorted(_normalize(r) for r in requirements[1:]),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@contextlib.contextmanager
def _shown(progress: Progress | None, title: str) -> Iterator[Progress]:
    """``progress``, or else a progress display on stderr that appears only once something
    is built (reusing a cached virtualenv and corral's cached wheel stays silent)."""
    if progress is not None:
        yield progress
        return
    activity: Activity | None = None

    def show(line: str) -> None:
        nonlocal activity
        if activity is None:
            if line.startswith("reusing "):
                return
            activity = Activity(title).__enter__()
        activity(line)

    try:
        yield show
    except BaseException:
        if activity is not None:
            activity.done(f"{title}: failed after {activity.seconds:.1f} s", style="red")
        raise
    if activity is not None:
        activity.done(f"{title}: done in {activity.seconds:.1f} s (cached for later starts)")


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise VenvError(
                        f"another process has been building the virtualenv locked by {path} "
                        f"for over {timeout:g} s; wait for it or remove the lock file"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def _host_pip_supports_python_option() -> bool:
    """This interpreter's pip can install into another interpreter (``--python``, 22.3+)."""
    try:
        import pip
    except ImportError:
        return False
    parts = re.findall(r"\d+", pip.__version__)[:2]
    return tuple(int(p) for p in parts) >= (22, 3)


def _build(
    path: Path,
    python: str,
    requirements: Sequence[str],
    wheelhouse: Path,
    offline: bool,
    progress: Progress | None,
) -> None:
    venv_python = path / "bin" / "python"
    if _host_pip_supports_python_option():
        # A virtualenv without pip is made in milliseconds; this interpreter's pip fills it.
        run_step([python, "-m", "venv", "--without-pip", str(path)], "creating the venv", progress)
        pip = [sys.executable, "-m", "pip", "--python", str(venv_python)]
    else:
        run_step([python, "-m", "venv", str(path)], "creating the venv", progress)
        pip = [str(venv_python), "-m", "pip"]
    # Not quiet: pip's lines ("Collecting ...") are what the progress display shows.
    plain = ["--disable-pip-version-check", "--no-input"]
    local = ["--no-index", "--find-links", str(wheelhouse)]
    install = [*pip, "install", *plain, *local, *requirements]
    wheelhouse.mkdir(parents=True, exist_ok=True)
    try:
        # Expected to fail while the wheelhouse lacks a wheel: its output is not shown.
        run_step([*install, "-q"], "installing from the wheelhouse", None)
        return
    except BuildError as exc:
        if offline:
            raise VenvError(
                f"offline: the wheelhouse {wheelhouse} (and pip's find-links) lack wheels for "
                f"{', '.join(requirements)}:\n{exc}\nbuild once online, or put the wheels "
                "there (pip download -d WHEELHOUSE ...)"
            ) from None
    if progress is not None:
        progress(f"fetching missing wheels into {wheelhouse}")
    fetch = ["--wheel-dir", str(wheelhouse), "--find-links", str(wheelhouse)]
    # A local wheel (corral's own, built from its source tree) keeps its name across source
    # changes; pip would take a same-named stale copy from the wheel dir over the file asked
    # for, with the old dependencies. Local wheels never stay in the shared wheelhouse.
    local_wheels = [wheelhouse / Path(r).name for r in requirements if r.endswith(".whl")]
    for stale in local_wheels:
        stale.unlink(missing_ok=True)
    try:
        run_step(
            [*pip, "wheel", *plain, *fetch, *requirements],
            "downloading and building wheels",
            progress,
            hint="Check the dependency names and versions in pyproject.toml.",
        )
    finally:
        for copied in local_wheels:
            copied.unlink(missing_ok=True)
    run_step(install, "installing the environment's dependencies", progress)


def ensure_venv(
    env_dir: str | Path,
    *,
    cache_dir: str | Path | None = None,
    python: str | None = None,
    offline: bool = False,
    progress: Progress | None = None,
    lock_timeout: float = 900.0,
) -> EnvVenv:
    """The cached virtualenv of the environment in ``env_dir``, built if needed.

    Args:
        env_dir: the environment's directory (its ``pyproject.toml`` is read; without
            one the virtualenv holds corral only).
        cache_dir: where virtualenvs live (default :func:`venv_cache_dir`).
        python: the interpreter to base it on (default: this one's base interpreter).
        offline: never contact the package index (use the wheelhouse and pip's
            find-links only).
        progress: receives each line of output (default: a progress display on stderr
            while something is built, then a one-line summary).
        lock_timeout: seconds to wait for another process building the same virtualenv.

    Raises:
        ManifestError: ``pyproject.toml`` is invalid.
        VenvError: the build failed (pip's output and the fix are in the message).
    """
    base = python or _base_python()
    cache = Path(cache_dir) if cache_dir is not None else venv_cache_dir()
    title = f"building the virtualenv of {Path(env_dir).resolve().name}"
    with _shown(progress, title) as show:
        requirements = requirements_for(env_dir, show)
        key = venv_key(base, requirements)
        path = cache / key
        venv_python = path / "bin" / "python"
        with _locked(cache / f"{key}.lock", lock_timeout):
            if (path / MARKER).is_file() and venv_python.exists():
                show(f"reusing the virtualenv {path}")
                return EnvVenv(path, venv_python, key, tuple(requirements), reused=True)
            show(f"building a virtualenv for {len(requirements)} requirement(s) in {path}")
            shutil.rmtree(path, ignore_errors=True)
            try:
                _build(path, base, requirements, cache / "wheelhouse", offline, show)
                record = {
                    "key": key,
                    "python": _interpreter_id(base),
                    "requirements": requirements,
                }
                text = json.dumps(record, indent=2) + "\n"
                (path / MARKER).write_text(text, encoding="utf-8")
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
    return EnvVenv(path, venv_python, key, tuple(requirements), reused=False)
