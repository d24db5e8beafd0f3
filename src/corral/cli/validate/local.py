"""``corral validate [PATH]``: an environment's static checks and runtime smoke test.

    corral validate                  # the environment in the current directory
    corral validate path/to/env      # static checks, then the server in a local process
    corral validate --docker         # the image 'corral build' made, run in Docker
    corral validate --image TAG      # any image of this environment
    corral validate --static         # static checks only

Static checks: the manifest, the ``pyproject.toml``, the entry point, the wire safety of
the models, the contract version against the manifest's, and the schema lock (no
breaking change without a major version bump). The runtime smoke test
(:func:`corral.providers.validation.smoke_test`) starts the environment through a
provider and plays short episodes over both codecs: reset/step/state, the contract
round trip of every model, seeded determinism, reward and termination sanity. For an
environment that declares a snapshot, the snapshot check (:func:`snapshot_check`, in
this process) restores a snapshot taken mid-episode in a fresh instance, steps both with
the same actions and compares every observation; one that declares none is reported
"not supported".

By default the server runs in a local process; when the image ``corral build`` made of
this version exists and serves the current contract, it is validated in Docker too, so
``corral validate && corral build && corral validate`` validates the source, then the
image. The command (:mod:`corral.cli.validate.command`) prints the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.cli.validate.report import Check, Report, Status
from corral.contract import Environment
from corral.contract.examples import example_for
from corral.contract.lock import LockError, check_lock, read_lock
from corral.contract.wiresafe import WireSafetyError, check_model
from corral.episodes import first_difference
from corral.providers.base import Provider
from corral.providers.dockerfile import LABEL_PREFIX, image_tag
from corral.providers.local import LocalProcessProvider, Sandbox
from corral.providers.manifest import (
    Manifest,
    ManifestError,
    load_environment,
    load_manifest,
    project_dependencies,
)
from corral.providers.validation import Finding, smoke_test

STATIC = "static"


@dataclass(frozen=True)
class LocalOptions:
    """How ``corral validate PATH`` runs (the command's options).

    Attributes:
        runtime: run the smoke test (``--static`` turns it off).
        docker: validate the manifest's image in Docker instead of a local process.
        image: validate this image in Docker instead of a local process.
        venv: run the local server in a virtualenv built from ``pyproject.toml``.
        sandbox: run the local server in a namespace sandbox.
        network: the Docker networking (``bridge`` or ``host``).
        action: a valid action (default: synthesized from the action schema).
        seed: the seed of every episode.
        steps: the most steps played per episode.
        timeout: seconds any single request may take.
    """

    runtime: bool = True
    docker: bool = False
    image: str | None = None
    venv: bool = False
    sandbox: Sandbox = "none"
    network: str = "bridge"
    action: dict[str, Any] | None = None
    seed: int = 0
    steps: int = 20
    timeout: float = 30.0


class _Static:
    """The static checks, in order; each stops the ones that depend on it."""

    def __init__(self, path: Path, report: Report) -> None:
        self.path = path
        self.report = report
        self.manifest: Manifest | None = None
        self.env: type[Environment[Any, Any, Any]] | None = None

    def add(self, cid: str, title: str, status: Status, detail: str) -> None:
        self.report.checks.append(Check(f"static.{cid}", STATIC, title, status, detail))

    def run(self) -> None:
        try:
            self.manifest = load_manifest(self.path)
        except ManifestError as exc:
            self.add("manifest", "the manifest is valid", Status.FAIL, str(exc))
            return
        m = self.manifest
        where = m.path.name if m.path else "manifest"
        self.add(
            "manifest",
            "the manifest is valid",
            Status.PASS,
            f"{where}: {m.name} {m.version}, contract {m.contract_version}, {m.entry_point}",
        )
        self.pyproject(m)
        try:
            self.env = load_environment(m)
        except (ImportError, TypeError) as exc:
            self.add("entry_point", "the entry point loads an Environment", Status.FAIL, str(exc))
            return
        except Exception as exc:
            detail = f"importing it raised {type(exc).__name__}: {exc}"
            self.add("entry_point", "the entry point loads an Environment", Status.FAIL, detail)
            return
        self.add(
            "entry_point",
            "the entry point loads an Environment",
            Status.PASS,
            f"{self.env.__module__}.{self.env.__qualname__}",
        )
        self.wire_safety(self.env)
        self.contract_version(m, self.env)
        self.lock(m, self.env)

    def pyproject(self, m: Manifest) -> None:
        title = "pyproject.toml lists the dependencies"
        if not (m.root / "pyproject.toml").is_file():
            self.add(
                "pyproject", title, Status.SKIP, "no pyproject.toml: a plain folder of modules"
            )
            return
        try:
            deps = project_dependencies(m.root)
        except ManifestError as exc:
            self.add("pyproject", title, Status.FAIL, str(exc))
            return
        self.add("pyproject", title, Status.PASS, ", ".join(deps) or "no dependencies")

    def wire_safety(self, env: type[Environment[Any, Any, Any]]) -> None:
        title = "the models can cross the wire"
        try:
            contract = env.contract()
            for model in (contract.action, contract.observation, contract.state):
                check_model(model)
        except (WireSafetyError, TypeError) as exc:
            self.add("wire_safe", title, Status.FAIL, str(exc))
            return
        names = (contract.action.__name__, contract.observation.__name__, contract.state.__name__)
        self.add("wire_safe", title, Status.PASS, ", ".join(names))

    def contract_version(self, m: Manifest, env: type[Environment[Any, Any, Any]]) -> None:
        title = "the manifest and the class agree on the contract version"
        if m.contract_version != env.contract_version:
            self.add(
                "contract_version",
                title,
                Status.FAIL,
                f"{m.path.name if m.path else 'the manifest'} says {m.contract_version}, "
                f"{env.__name__}.contract_version is {env.contract_version}; make them equal",
            )
            return
        self.add("contract_version", title, Status.PASS, env.contract_version)

    def lock(self, m: Manifest, env: type[Environment[Any, Any, Any]]) -> None:
        title = "the models are compatible with the schema lock"
        try:
            locked = read_lock(m.lock_path)
        except LockError as exc:
            self.add("schema_lock", title, Status.FAIL, str(exc))
            return
        result = check_lock(locked, env.contract())
        if not result.ok:
            shown = "; ".join(f"{c.path}: {c.message}" for c in result.breaking[:3])
            more = f" (and {len(result.breaking) - 3} more)" if len(result.breaking) > 3 else ""
            self.add(
                "schema_lock",
                title,
                Status.FAIL,
                f"{len(result.breaking)} breaking change(s) without a major version bump: "
                f"{shown}{more}; see 'corral schema diff'",
            )
            return
        if result.stale:
            why = "major version bumped" if result.breaking else "compatible changes"
            detail = f"{why}; run 'corral schema lock' to record them"
        else:
            detail = f"matches {m.schema_lock}"
        self.add("schema_lock", title, Status.PASS, detail)


def _action(env: type[Environment[Any, Any, Any]], given: dict[str, Any] | None) -> dict[str, Any]:
    """A valid action: the given one, or one synthesized from the action schema.

    Raises:
        ValueError: none could be made, or the given one is invalid; the message says so.
    """
    schema = env.contract().schemas["action"]
    if given is not None:
        candidate = given
    else:
        try:
            candidate = example_for(dict(schema))
        except ValueError as exc:
            raise ValueError(
                f"cannot synthesize an action from the schema ({exc}); pass --action JSON"
            ) from None
    if not isinstance(candidate, dict):
        raise ValueError("the action must be a JSON object; pass --action JSON")
    try:
        env.action_type.model_validate(candidate)
    except Exception as exc:
        hint = "fix --action" if given is not None else "pass --action JSON"
        raise ValueError(f"action {candidate} is not valid ({exc}); {hint}") from None
    return candidate


async def _called(value: Any) -> Any:
    """``value``, awaited if a method returned a coroutine (``async def`` methods)."""
    return await value if inspect.isawaitable(value) else value


def _differs(a: Any, b: Any) -> str | None:
    """Where two models' JSON forms differ, or None."""
    return first_difference(a.model_dump(mode="json"), b.model_dump(mode="json"))


async def _snapshot_round(
    env: type[Environment[Any, Any, Any]], action: dict[str, Any], seed: int, steps: int
) -> str:
    """Snapshot → restore in a fresh instance → the same observations (see
    :func:`snapshot_check`); returns what was compared.

    Raises:
        AssertionError: naming the first difference.
    """
    model = env.snapshot_type
    assert model is not None
    typed = env.action_type.model_validate(action)
    made: list[Environment[Any, Any, Any]] = []

    def instance() -> Environment[Any, Any, Any]:
        made.append(env())
        return made[-1]

    try:
        # A session never reset can be snapshotted too (the fleet moves such sessions).
        blank = await _called(instance().snapshot())
        await _called(instance().restore(model.model_validate_json(blank.model_dump_json())))
        source = instance()
        last = await _called(source.reset(seed))
        played = 0
        while played < max(1, steps // 2) and not last.done:
            last = await _called(source.step(typed))
            played += 1
        taken = await _called(source.snapshot())
        wire = taken.model_dump_json()  # what crosses the wire, validated on the other side
        copy = instance()
        restored = await _called(copy.restore(model.model_validate_json(wire)))
        where = _differs(restored, last)
        if where is not None:
            raise AssertionError(
                f"restore() returned another observation than the last step's (at {where})"
            )
        compared = 0
        while compared + played < steps and not last.done:
            last = await _called(source.step(typed))
            other = await _called(copy.step(typed))
            compared += 1
            where = _differs(other, last)
            if where is not None:
                raise AssertionError(
                    f"step {played + compared} after the restore differs (at {where}): "
                    "snapshot() must capture every part of the state the next steps use "
                    "(random generators included)"
                )
        where = _differs(await _called(copy.state()), await _called(source.state()))
        if where is not None:
            raise AssertionError(f"the restored state differs (at {where})")
    finally:
        for made_env in made:
            with contextlib.suppress(Exception):
                closing: Any = made_env.close  # sync or async
                await _called(closing())
    return (
        f"{model.__name__} of {len(wire)} bytes after {played} step(s); "
        f"{compared} more step(s) identical"
    )


def snapshot_check(
    env: type[Environment[Any, Any, Any]], action: dict[str, Any], seed: int, steps: int
) -> Check:
    """Snapshot → restore → same observations, in this process.

    A snapshot taken after half the steps (through its JSON form, as it crosses the
    wire) is restored in a fresh instance; the restore must return the last observation,
    then both instances are stepped with ``action`` and every observation and the final
    state compared. Skipped, "not supported", when the environment declares no snapshot.
    """
    title = "snapshot → restore → the same observations"
    if not env.has_snapshots():
        return Check(
            "runtime.snapshot",
            "runtime",
            title,
            Status.SKIP,
            f"not supported: {env.__name__} declares no snapshot (define snapshot() and "
            "restore() to support restore, fork and moving sessions; see docs/snapshots.md)",
        )
    try:
        detail = asyncio.run(_snapshot_round(env, action, seed, steps))
    except AssertionError as exc:
        return Check("runtime.snapshot", "runtime", title, Status.FAIL, str(exc))
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        return Check("runtime.snapshot", "runtime", title, Status.FAIL, detail)
    return Check("runtime.snapshot", "runtime", title, Status.PASS, detail)


def _docker_provider(network: str) -> tuple[Provider | None, str]:
    """A Docker provider, or None and why there is none."""
    try:
        from corral.providers.docker import DockerProvider, docker_client
    except ImportError as exc:
        return None, str(exc)
    try:
        client = docker_client()
    except Exception as exc:
        return None, str(exc)
    return DockerProvider(client, network=network), ""  # type: ignore[arg-type]


def _image_state(provider: Provider, tag: str, fingerprint: str) -> tuple[bool, str]:
    """Whether ``tag`` exists and serves ``fingerprint``, and what to say if not."""
    client = getattr(provider, "client", None)
    if client is None:
        return False, "no Docker client"
    import docker.errors

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False, f"no image {tag}; run 'corral build' to validate the image too"
    except docker.errors.APIError as exc:
        return False, f"the engine could not inspect {tag}: {exc}"
    labelled = (image.labels or {}).get(f"{LABEL_PREFIX}.fingerprint")
    if labelled != fingerprint:
        return False, (
            f"image {tag} was built from other models (fingerprint {labelled}, the source "
            f"has {fingerprint}); run 'corral build' again, or pass --image {tag}"
        )
    return True, ""


def _findings(protocol: str, findings: list[Finding]) -> Iterator[Check]:
    for f in findings:
        status = Status.SKIP if f.ok is None else Status.PASS if f.ok else Status.FAIL
        yield Check(f"{protocol}.{f.id}", protocol, f.title, status, f.detail)


async def _runtime(
    report: Report,
    provider: Provider,
    protocol: str,
    target: str,
    env: type[Environment[Any, Any, Any]],
    action: dict[str, Any],
    options: LocalOptions,
) -> None:
    async with provider:
        findings = await smoke_test(
            provider,
            target,
            action,
            env=env,
            seed=options.seed,
            steps=options.steps,
            timeout=options.timeout,
        )
    report.checks.extend(_findings(protocol, findings))
    report.protocols[protocol] = True


def _skip(report: Report, protocol: str, detail: str) -> None:
    report.checks.append(
        Check(f"{protocol}.start", protocol, "the server starts and is ready", Status.SKIP, detail)
    )


def validate_environment(path: Path, options: LocalOptions | None = None) -> Report:
    """Run the static checks of the environment at ``path`` and, unless turned off, the
    runtime smoke test (see the module docstring); return the report."""
    opts = options or LocalOptions()
    report = Report(target=str(path), protocols={STATIC: True})
    static = _Static(path, report)
    static.run()
    if not opts.runtime:
        return report
    manifest, env = static.manifest, static.env
    if manifest is None or env is None:
        _skip(report, "local", "the static checks above failed")
        return report
    try:
        action = _action(env, opts.action)
    except ValueError as exc:
        # Not a skip: without an action no server can be exercised, and --static says so.
        report.checks.append(
            Check("runtime.action", "runtime", "a valid action to play", Status.FAIL, str(exc))
        )
        return report
    report.checks.append(snapshot_check(env, action, opts.seed, opts.steps))
    explicit_image = opts.image or (image_tag(manifest) if opts.docker else None)
    if explicit_image is None:
        local = LocalProcessProvider(venv=opts.venv, sandbox=opts.sandbox)
        asyncio.run(_runtime(report, local, "local", str(manifest.root), env, action, opts))
    docker, why = _docker_provider(opts.network)
    try:
        if explicit_image is not None:
            if docker is None:
                report.checks.append(
                    Check("docker.start", "docker", "the server starts", Status.FAIL, why)
                )
                return report
            target = explicit_image
        else:
            ok, why_not = (
                _image_state(docker, image_tag(manifest), env.contract().fingerprint)
                if docker is not None
                else (False, f"no Docker ({why}); the image is not validated")
            )
            if not ok:
                _skip(report, "docker", why_not)
                return report
            target = image_tag(manifest)
        assert docker is not None
        asyncio.run(_runtime(report, docker, "docker", target, env, action, opts))
        docker = None
    finally:
        if docker is not None:
            with contextlib.suppress(Exception):
                asyncio.run(docker.close())
    return report
