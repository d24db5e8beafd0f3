"""Publishing an environment as a Hugging Face Docker Space.

:func:`stage_space` writes a folder that is a complete Docker Space: ``README.md`` whose
YAML front matter configures the Space (``sdk: docker``, ``app_port`` ...), the generated
``Dockerfile`` at the root, and the build context it needs (pinned requirements, corral's
and the environment's wheels, the environment's files under ``app/``). The Space's
builder has network access, so dependencies are installed from the package index at
the pinned versions (pass ``offline=True`` to ship every wheel instead).

:func:`push_space` creates the Space if needed and uploads the folder in one commit with
``huggingface_hub``. Needs the ``hf`` extra (``pip install corral[hf]``).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from corral.contract.lock import LockError, read_lock
from corral.errors import PlatformError, UsageError
from corral.providers.dockerfile import BuildContext, Progress, prepare_context
from corral.providers.manifest import Manifest, load_contract

SPACE_COLORS = ("red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray")
"""The colours a Space card accepts for ``colorFrom`` / ``colorTo``."""

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


SHORT_DESCRIPTION_MAX = 60
"""The longest ``short_description`` a Space card accepts."""


class SpaceError(UsageError, ValueError):
    """Bad arguments for a Space (repo id, colours, folder)."""


class HubUnreachable(PlatformError, ConnectionError):
    """The Hub could not be reached; nothing was uploaded and the staged Space is intact.

    Attributes:
        endpoint: the Hub's URL that was tried.
        staged: the staged Space folder, ready to be pushed again.
    """

    def __init__(self, endpoint: str, staged: Path, reason: str) -> None:
        super().__init__(
            f"the Hugging Face Hub at {endpoint} is unreachable ({reason}); nothing was "
            f"uploaded. The Space is staged in {staged}: push again when online"
        )
        self.endpoint = endpoint
        self.staged = staged


def short_description(text: str, limit: int = SHORT_DESCRIPTION_MAX) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word boundary with "…"."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:.-") + "…"


def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` if it is ``OWNER/NAME``.

    Raises:
        SpaceError: it is not, with the expected form.
    """
    if not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".git", "-", ".")):
        raise SpaceError(
            f"repo id {repo_id!r} must be OWNER/NAME (letters, digits, '-', '_', '.'), "
            "e.g. my-org/echo-env"
        )
    return repo_id


@dataclass(frozen=True)
class StagedSpace:
    """A folder ready to be uploaded as a Space.

    Attributes:
        directory: the folder.
        repo_id: the Space it is meant for.
        front_matter: the README's YAML front matter.
        context: the build context the folder contains.
    """

    directory: Path
    repo_id: str
    front_matter: dict[str, Any]
    context: BuildContext

    @property
    def files(self) -> list[str]:
        """Every file of the folder, relative and sorted."""
        return sorted(
            p.relative_to(self.directory).as_posix()
            for p in self.directory.rglob("*")
            if p.is_file()
        )


def _type_of(node: Mapping[str, Any]) -> str:
    """A short, Python-like spelling of a JSON Schema type."""
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    if "const" in node:
        return f"Literal[{node['const']!r}]"
    if "enum" in node:
        return "Literal[" + ", ".join(repr(v) for v in node["enum"]) + "]"
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " | ".join(_type_of(alt) for alt in node[key])
    kind = node.get("type")
    if kind == "array":
        if "prefixItems" in node:
            return "tuple[" + ", ".join(_type_of(i) for i in node["prefixItems"]) + "]"
        items = node.get("items")
        return f"list[{_type_of(items)}]" if isinstance(items, Mapping) else "list"
    if kind == "object":
        extra = node.get("additionalProperties")
        return f"dict[str, {_type_of(extra)}]" if isinstance(extra, Mapping) else "dict"
    names = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}
    if kind == "null":
        return "None"
    return names.get(str(kind), "Any")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def contract_markdown(schemas: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown tables of the action, observation and state fields of a contract."""
    sections: list[str] = []
    for model in ("action", "observation", "state"):
        schema = schemas.get(model)
        if not schema:
            continue
        root: Mapping[str, Any] = schema
        if "$ref" in schema:
            root = schema.get("$defs", {}).get(str(schema["$ref"]).rsplit("/", 1)[-1], schema)
        title = root.get("title", model.title())
        required = set(root.get("required", []))
        rows = ["| field | type | required | default | description |", "|---|---|---|---|---|"]
        for name, prop in root.get("properties", {}).items():
            default = "" if "default" not in prop else f"`{prop['default']!r}`"
            rows.append(
                f"| `{name}` | `{_cell(_type_of(prop))}` | {'yes' if name in required else ''} "
                f"| {_cell(default)} | {_cell(str(prop.get('description', '')))} |"
            )
        sections.append(f"### {model.title()}: `{title}`\n\n" + "\n".join(rows))
    return "\n\n".join(sections)


def _schemas(manifest: Manifest) -> Mapping[str, Mapping[str, Any]] | None:
    try:
        return load_contract(manifest).schemas
    except (ImportError, TypeError):
        try:
            return read_lock(manifest.lock_path).schemas
        except LockError:
            return None


def render_readme(
    manifest: Manifest,
    front_matter: Mapping[str, Any],
    schemas: Mapping[str, Mapping[str, Any]] | None,
    repo_id: str,
) -> str:
    """The Space's README: front matter, description, how to connect, the contract."""
    header = yaml.safe_dump(dict(front_matter), sort_keys=False, allow_unicode=True)
    owner, name = repo_id.split("/")
    host = f"https://{owner.lower()}-{name.lower().replace('_', '-').replace('.', '-')}.hf.space"
    body = [
        f"# {front_matter['title']}",
        manifest.description or f"The `{manifest.name}` environment, served by corral.",
        "## Connect",
        "```python\n"
        "from corral.client import AsyncEnvClient\n\n"
        f'async with AsyncEnvClient("{host}") as env:\n'
        "    result = await env.reset()\n"
        "```",
        f"Contract version `{manifest.contract_version}`, entry point `{manifest.entry_point}`.",
    ]
    if schemas is not None:
        body += ["## Contract", contract_markdown(schemas)]
    return f"---\n{header}---\n\n" + "\n\n".join(body) + "\n"


def stage_space(
    env_dir: str | Path,
    out_dir: str | Path,
    repo_id: str,
    *,
    title: str | None = None,
    emoji: str = "🤠",
    color_from: str = "green",
    color_to: str = "blue",
    pinned: bool = False,
    tags: Sequence[str] = (),
    base_image: str | None = None,
    offline: bool = False,
    progress: Progress | None = None,
    pip: Sequence[str] | None = None,
) -> StagedSpace:
    """Write a Docker Space for the environment in ``env_dir`` to ``out_dir``.

    Args:
        env_dir: the environment's directory.
        out_dir: the Space folder to write (replaced if it exists).
        repo_id: the Space's ``OWNER/NAME``.
        title: the Space's title (default: the environment's name).
        emoji: the Space card's emoji.
        color_from / color_to: the card's gradient, from :data:`SPACE_COLORS`.
        pinned: pin the Space on its owner's profile.
        tags: extra tags (``corral`` and ``reinforcement-learning`` are always added).
        base_image: overrides the manifest's base image (it must be pullable by the
            Space's builder: a public image, not a locally bootstrapped one).
        offline: ship every wheel in the Space (no index needed at build time).
        progress: receives each line of output.
        pip: the pip command used on the host.

    Raises:
        SpaceError: a bad repo id or colour.
        ManifestError / BuildError: as for :func:`~corral.providers.dockerfile.prepare_context`.
    """
    check_repo_id(repo_id)
    for key, color in (("color_from", color_from), ("color_to", color_to)):
        if color not in SPACE_COLORS:
            raise SpaceError(f"{key} {color!r} is not a Space colour; use one of {SPACE_COLORS}")
    # A Space opens on its app's root: serve the web UI there, not a JSON 404.
    context = prepare_context(
        env_dir,
        out_dir,
        base_image=base_image,
        offline=offline,
        progress=progress,
        pip=pip,
        web=True,
    )
    manifest = context.manifest
    all_tags = ["corral", "reinforcement-learning"]
    all_tags += [t for t in tags if t not in all_tags]
    front_matter: dict[str, Any] = {
        "title": title or manifest.name,
        "emoji": emoji,
        "colorFrom": color_from,
        "colorTo": color_to,
        "sdk": "docker",
        "app_port": manifest.port,
        "pinned": pinned,
        "tags": all_tags,
    }
    if manifest.description:
        front_matter["short_description"] = short_description(manifest.description)
    readme = render_readme(manifest, front_matter, _schemas(manifest), repo_id)
    (context.directory / "README.md").write_text(readme, encoding="utf-8")
    return StagedSpace(
        directory=context.directory,
        repo_id=repo_id,
        front_matter=front_matter,
        context=context,
    )


@dataclass(frozen=True)
class PushedSpace:
    """The result of :func:`push_space`.

    Attributes:
        url: the Space's page.
        commit_url: the upload commit's page.
        commit_oid: the upload commit's id.
    """

    url: str
    commit_url: str
    commit_oid: str


def push_space(
    staged_dir: str | Path,
    repo_id: str,
    token: str | None = None,
    *,
    private: bool | None = None,
    endpoint: str | None = None,
    commit_message: str | None = None,
) -> PushedSpace:
    """Create the Docker Space ``repo_id`` if needed and upload ``staged_dir`` to it.

    Args:
        staged_dir: a folder written by :func:`stage_space`.
        repo_id: ``OWNER/NAME``.
        token: a Hub token with write access (default: the locally saved one / ``HF_TOKEN``).
        private: create the Space private (ignored when it exists).
        endpoint: the Hub's URL (default: ``HF_ENDPOINT`` or huggingface.co).
        commit_message: the upload commit's message.

    Raises:
        SpaceError: a bad repo id, or a folder that is not a staged Space.
        HubUnreachable: no connection to the Hub (the staged folder is left as it is).
        huggingface_hub.errors.HfHubHTTPError: the Hub refused a request.
    """
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "pushing a Space needs huggingface_hub: pip install 'corral[hf]'"
        ) from exc
    check_repo_id(repo_id)
    folder = Path(staged_dir)
    for required in ("README.md", "Dockerfile"):
        if not (folder / required).is_file():
            raise SpaceError(f"{folder} has no {required}; stage it first (corral push stages it)")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        url = api.create_repo(
            repo_id, repo_type="space", space_sdk="docker", exist_ok=True, private=private
        )
        info = api.upload_folder(
            repo_id=repo_id,
            repo_type="space",
            folder_path=str(folder),
            commit_message=commit_message or "Upload environment with corral",
        )
    except Exception as exc:
        if not _unreachable(exc):
            raise
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise HubUnreachable(str(api.endpoint), folder, reason) from exc
    return PushedSpace(url=str(url), commit_url=str(info.commit_url), commit_oid=info.oid)


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means "no connection to the Hub" rather than a refusal by it.

    huggingface_hub's HTTP stack has changed (requests, httpx, its own httpx fork); under
    each, a connection failure carries the socket error it came from (refused, name not
    resolved, timed out) in its chain of causes, so that chain is what is read.
    """
    from huggingface_hub.errors import OfflineModeIsEnabled

    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 16:
        if isinstance(current, (OfflineModeIsEnabled, ConnectionError, socket.gaierror)):
            return True
        if isinstance(current, TimeoutError):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False
