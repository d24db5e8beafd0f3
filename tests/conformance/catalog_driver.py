"""Play one OpenEnv environment's episode under OpenEnv's server and each ``corral serve``
form; print JSON.

    python catalog_driver.py SPEC.json      (inside a catalogue virtualenv, see venvs.py)

SPEC names the OpenEnv checkout (``src``) and one :class:`~tests.conformance.catalog.CatalogEnv`
as a JSON object. The environment's own client plays the episode (reset with the fixed
seed, then each action; ``list_tools``/``call_tool`` for an MCP environment) against (a)
its app under OpenEnv's own server (uvicorn) and (b) ``corral serve`` of each form; the
output gives, per form, ``equal``, ``differs`` (with the first difference), ``refused``
(corral named the form that works), ``failed`` (with the reason), or ``openenv-fails``
(OpenEnv's own server cannot run the environment under this release; corral played it).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from driver import OPENENV_LAUNCHER, normalize, server

FORMS = ("directory", "module:app", "module:Class")


def _load(package: str, reference: str) -> Any:
    module, _, attr = reference.partition(":")
    return getattr(importlib.import_module(f"{package}.{module}"), attr)


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _result(result: Any) -> dict[str, Any]:
    return {
        "observation": _dump(result.observation),
        "reward": result.reward,
        "done": result.done,
    }


async def episode(url: str, spec: dict[str, Any]) -> list[Any]:
    """The episode, as the environment's own client sees it."""
    client_cls = _load(spec["name"], spec["client"])
    action_cls = _load(spec["name"], spec["action"]) if spec["action"] else None
    out: list[Any] = []
    client = client_cls(base_url=url)
    try:
        out.append(_result(await client.reset(**spec["reset"])))
        if action_cls is None:
            out.append(sorted(t.name for t in await client.list_tools()))
        for action in spec["actions"]:
            try:
                if action_cls is None:
                    out.append(_dump(await client.call_tool(action[0], **action[1])))
                else:
                    out.append(_result(await client.step(action_cls(**action))))
            except Exception as exc:
                out.append({"raised": type(exc).__name__, "message": str(exc)[:300]})
        state = await client.state()
        out.append({"state": _dump(state)})
    finally:
        await client.close()
    return normalize(out)


def shape(value: Any) -> Any:
    """``value`` with every leaf replaced by its type's name, a list by its first item's
    shape: what an environment that is random by design (whatever the seed) must still
    agree on."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items from OpenEnv, {len(b)} from corral"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    if a != b:
        return f"{where}: OpenEnv {json.dumps(a)[:200]}, corral {json.dumps(b)[:200]}"
    return None


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    envs = Path(spec["src"]) / "envs"
    sys.path.insert(0, str(envs))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        oe_file = Path(tmp) / "openenv.url"
        app = f"{spec['name']}.server.app:app"
        launch = [sys.executable, "-c", OPENENV_LAUNCHER, app, str(oe_file)]
        reference: Any = None
        failure = ""
        try:
            with server(launch, oe_file, str(envs)) as url:
                reference = asyncio.run(episode(url, spec))
        except Exception as exc:  # OpenEnv's own server cannot run it under this release
            failure = f"{type(exc).__name__}: {str(exc)[-300:]}"
            results["openenv_failure"] = failure
        results["openenv"] = reference
        for form in FORMS:
            target = spec["targets"][form]
            url_file = Path(tmp) / f"corral-{FORMS.index(form)}.url"
            command = [sys.executable, "-m", "corral", "serve", target, "--port", "0"]
            command += ["--port-file", str(url_file)]
            try:
                with server(command, url_file, str(envs)) as url:
                    played = asyncio.run(episode(url, spec))
            except RuntimeError as exc:  # the server did not start: its output says why
                text = str(exc)
                # A refusal names the forms that work (corral.cli.target).
                status = "refused" if "the environment's directory" in text else "failed"
                results[form] = {"status": status, "detail": text.strip().splitlines()[-1:]}
                continue
            except Exception as exc:
                message = f"{type(exc).__name__}: {str(exc)[-300:]}"
                # The same failure under OpenEnv's server: the environment's (or its
                # client's) under this release, not corral's.
                status = "openenv-fails" if message == failure else "failed"
                results[form] = {"status": status, "detail": [message]}
                continue
            if reference is None:
                results[form] = {"status": "openenv-fails", "steps": len(played)}
                continue
            if spec["deterministic"]:
                difference = first_difference(reference, played)
            else:
                # Step by step: the episode's length is the same; each step's shape.
                difference = first_difference(
                    [shape(step) for step in reference], [shape(step) for step in played]
                )
            agreed = "equal" if spec["deterministic"] else "same-shape"
            results[form] = (
                {"status": agreed, "steps": len(played)}
                if difference is None
                else {"status": "differs", "detail": [difference]}
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
