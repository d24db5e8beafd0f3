"""The environment manifest, ``corral.yaml`` (``openenv.yaml`` is read too).

A manifest says what an environment is (name, version, contract version), how to start
it (entry point, port), what it may use (CPU, memory, processes, sessions) and where its
schema lock lives. Python dependencies are not repeated here: they are read from the
environment's ``pyproject.toml``.

Every validation problem is reported with the dotted key, the bad value and the fix,
and a YAML syntax error with its line and column, so that an author never has to read a
pydantic traceback to find a typo.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from corral.contract import Environment
from corral.contract.schema import SEMVER, Contract
from corral.errors import UsageError
from corral.server.target import load_target

MANIFEST_NAMES = ("corral.yaml", "openenv.yaml")
"""File names :func:`load_manifest` looks for in a directory, in order of preference."""

_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKMGTP]i?|[kKMGTP]?B?|)\s*$")
_MEMORY_UNITS = {
    "": 1,
    "B": 1,
    "k": 10**3,
    "K": 10**3,
    "kB": 10**3,
    "KB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "P": 10**15,
    "PB": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}
# Docker refuses memory limits below 6 MiB; a Python server needs far more than that.
MIN_MEMORY = 32 * 2**20


def parse_memory(value: int | float | str) -> int:
    """Bytes of a memory size: an integer (bytes) or a number with a Kubernetes-style unit.

    ``"512Mi"`` is 512 * 2**20, ``"1Gi"`` 2**30, ``"1G"`` 10**9, ``"1.5Gi"`` 1.5 * 2**30.

    Raises:
        ValueError: the value is not a size, with the accepted forms in the message.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory size; write e.g. 512Mi or 1Gi")
    if isinstance(value, int | float):
        amount, unit = float(value), ""
    else:
        match = _MEMORY.match(value)
        if match is None or match[2] not in _MEMORY_UNITS:
            raise ValueError(
                f"{value!r} is not a memory size; write bytes or a number with a unit: "
                "Ki Mi Gi Ti (powers of 1024) or k M G T (powers of 1000), e.g. 512Mi or 1Gi"
            )
        amount, unit = float(match[1]), match[2]
    size = int(amount * _MEMORY_UNITS[unit])
    if size < MIN_MEMORY:
        raise ValueError(f"{value!r} is below the minimum of 32Mi; a Python server needs more")
    return size


def format_memory(size: int) -> str:
    """The shortest exact binary-unit spelling of ``size`` bytes (``536870912`` → ``512Mi``)."""
    for unit in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _MEMORY_UNITS[unit]
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


class Resources(BaseModel):
    """What one server of the environment may use.

    Attributes:
        cpu: CPUs (fractions allowed: ``0.5`` is half a core).
        memory: the memory limit in bytes; written as ``512Mi``, ``1Gi``, ``2G`` or bytes.
        pids: the maximum number of processes and threads (a fork bomb stops there).
    """

    model_config = ConfigDict(extra="forbid")

    cpu: float = Field(default=1.0, gt=0, le=1024)
    memory: int = 1 * 2**30
    pids: int = Field(default=1024, ge=16)

    @field_validator("memory", mode="before")
    @classmethod
    def _parse_memory(cls, value: Any) -> int:
        if not isinstance(value, int | float | str):
            raise ValueError(f"{value!r} is not a memory size; write e.g. 512Mi or 1Gi")
        return parse_memory(value)


class Concurrency(BaseModel):
    """How many sessions one server holds and when idle ones are reaped.

    Attributes:
        max_sessions: sessions one server holds at once; more are refused at connect time.
        idle_timeout_s: a session idle for this many seconds is closed.
    """

    model_config = ConfigDict(extra="forbid")

    max_sessions: int = Field(default=64, ge=1)
    idle_timeout_s: float = Field(default=600.0, gt=0)


class Manifest(BaseModel):
    """A validated ``corral.yaml``.

    Attributes:
        name: the environment's name: lowercase letters, digits, ``.``, ``_``, ``-``
            (it names the Docker image and the Space).
        version: the package's semantic version.
        contract_version: the semantic version of the wire contract (Action,
            Observation, State); bump the major on a breaking change.
        entry_point: ``module:Class`` (an Environment subclass) or ``module:factory``.
        description: one paragraph for the README, the Space and ``/metadata``.
        port: the port the server listens on inside its container.
        python_version: the ``MAJOR.MINOR`` of the Python in the image.
        resources: CPU, memory and process limits of one server.
        concurrency: sessions per server and the idle timeout.
        schema_lock: the schema lock file, relative to the manifest's directory.
        base_image: the image to build on (default ``python:<python_version>-slim``).
        openenv: keys of an ``openenv.yaml`` that corral has no field for, kept verbatim.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str = "0.1.0"
    contract_version: str = "1.0.0"
    entry_point: str
    description: str = ""
    port: int = Field(default=8000, ge=1, le=65535)
    python_version: str = Field(default="3.11", pattern=r"^3\.\d{1,2}$")
    resources: Resources = Field(default_factory=Resources)
    concurrency: Concurrency = Field(default_factory=Concurrency)
    schema_lock: str = "corral.lock.json"
    base_image: str | None = None
    openenv: dict[str, Any] = Field(default_factory=dict)

    _path: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            suggestion = re.sub(r"[^a-z0-9._-]+", "-", value.lower()).strip("._-") or "my-env"
            raise ValueError(
                f"{value!r} is not a valid name: use lowercase letters, digits, '.', '_' and "
                f"'-', starting and ending with a letter or digit (e.g. {suggestion!r})"
            )
        return value

    @field_validator("version", "contract_version")
    @classmethod
    def _check_semver(cls, value: str) -> str:
        if not SEMVER.match(value):
            raise ValueError(
                f"{value!r} is not a semantic version; write MAJOR.MINOR.PATCH, e.g. '1.0.0'"
            )
        return value

    @field_validator("entry_point")
    @classmethod
    def _check_entry_point(cls, value: str) -> str:
        if not _ENTRY_POINT.match(value):
            raise ValueError(
                f"{value!r} is not an entry point; write 'package.module:ClassName' "
                "or 'package.module:factory'"
            )
        return value

    @field_validator("schema_lock")
    @classmethod
    def _check_lock(cls, value: str) -> str:
        if not value or Path(value).is_absolute() or ".." in Path(value).parts:
            raise ValueError(
                f"{value!r} must be a file path relative to the manifest's directory, "
                "e.g. 'corral.lock.json'"
            )
        return value

    @property
    def path(self) -> Path | None:
        """The file this manifest was loaded from, if any."""
        return self._path

    @property
    def root(self) -> Path:
        """The environment's directory (the manifest's, or the working directory)."""
        return self._path.parent if self._path is not None else Path.cwd()

    @property
    def lock_path(self) -> Path:
        """The schema lock file's absolute path."""
        return self.root / self.schema_lock

    @property
    def image_base(self) -> str:
        """The base image to build on."""
        return self.base_image or f"python:{self.python_version}-slim"

    def with_path(self, path: Path) -> Manifest:
        """This manifest, remembered as loaded from ``path``."""
        self._path = path.resolve()
        return self


class ManifestError(UsageError, ValueError):
    """A manifest could not be read or is invalid.

    Attributes:
        path: the manifest file (or the directory that has none).
        problems: one readable line per problem: key, bad value, fix.
    """

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: invalid manifest\n{lines}")


def _dotted(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]" if parts else f"[{item}]"]
        else:
            parts.append(item)
    return ".".join(parts) or "(top level)"


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the (sub)model that holds the key at ``loc``."""
    current: type[BaseModel] = model
    for item in loc[:-1]:
        field = current.model_fields.get(str(item))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        current = annotation
    return [name for name in current.model_fields if not name.startswith("_")]


def _describe(error: Any, model: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    key = _dotted(loc)
    kind = error["type"]
    value = error.get("input")
    if kind == "missing":
        return f"{key}: required key is missing; add it, e.g. '{key.split('.')[-1]}: ...'"
    if kind == "extra_forbidden":
        known = _fields_at(model, loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{key}: unknown key; {hint}known keys here: {', '.join(known)}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return f"{key}: {message}"
    return f"{key}: {message} (got {value!r}); fix the value of '{key}'"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(path, [f"cannot read the file: {exc.strerror or exc}"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = exc.problem or exc.context or "invalid YAML"
        raise ManifestError(
            path, [f"YAML syntax error at {where}: {problem}; fix the YAML there"]
        ) from exc
    except yaml.YAMLError as exc:
        raise ManifestError(path, [f"YAML error: {exc}"]) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ManifestError(
            path,
            [
                f"the top level must be a mapping of keys (name: ..., entry_point: ...), "
                f"not a {type(data).__name__}"
            ],
        )
    return data


_OPENENV_MAPPED = frozenset({"name", "version", "port", "app", "description"})


OPENENV_DEFAULT_APP = "server.app:app"
"""The entry point of an ``openenv.yaml`` that names no ``app:``, as OpenEnv defaults it."""


def _from_openenv(data: dict[str, Any]) -> dict[str, Any]:
    """Translate an ``openenv.yaml`` mapping into corral manifest keys."""
    mapped: dict[str, Any] = {
        key: data[key] for key in ("name", "version", "port", "description") if key in data
    }
    # The older format (name, version, description, action, observation) has no app:
    # OpenEnv's own default is the app in server/app.py.
    mapped["entry_point"] = data.get("app", OPENENV_DEFAULT_APP)
    if isinstance(mapped.get("name"), str):
        # OpenEnv names are often snake_case identifiers; corral accepts those as they are,
        # but not uppercase letters, which image and Space names refuse.
        mapped["name"] = mapped["name"].lower()
    validation = data.get("validation")
    if isinstance(validation, dict) and isinstance(validation.get("resources"), dict):
        res = validation["resources"]
        resources: dict[str, Any] = {}
        if "cpu" in res:
            resources["cpu"] = res["cpu"]
        if "memory_mb" in res:
            resources["memory"] = f"{res['memory_mb']}M"
        mapped["resources"] = resources
    mapped["openenv"] = {k: v for k, v in data.items() if k not in _OPENENV_MAPPED}
    return mapped


def find_manifest(path_or_dir: str | Path) -> Path:
    """The manifest file at ``path_or_dir``: the file itself, or the first of
    :data:`MANIFEST_NAMES` in that directory.

    Raises:
        ManifestError: there is no such file.
    """
    path = Path(path_or_dir)
    if path.is_dir():
        for name in MANIFEST_NAMES:
            if (path / name).is_file():
                return path / name
        raise ManifestError(
            path,
            [
                f"no {' or '.join(MANIFEST_NAMES)} in this directory; create corral.yaml with at "
                "least 'name:' and 'entry_point: module:Class' (or run 'corral init')"
            ],
        )
    if not path.is_file():
        raise ManifestError(path, ["no such file or directory; pass the environment's directory"])
    return path


def load_manifest(path_or_dir: str | Path = ".") -> Manifest:
    """Read and validate a manifest.

    Args:
        path_or_dir: a ``corral.yaml`` / ``openenv.yaml`` file, or a directory holding one
            (``corral.yaml`` wins when both exist).

    Raises:
        ManifestError: the file is missing, is not valid YAML, or does not validate; the
            message has one line per problem.
    """
    path = find_manifest(path_or_dir)
    data = _read_yaml(path)
    if path.name == "openenv.yaml":
        data = _from_openenv(data)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(path, [_describe(e, Manifest) for e in exc.errors()]) from None
    return manifest.with_path(path)


def project_dependencies(env_dir: str | Path) -> list[str]:
    """The ``[project].dependencies`` of the environment's ``pyproject.toml`` (``[]`` without one).

    Raises:
        ManifestError: the file exists but is not valid TOML or lists no strings.
    """
    path = Path(env_dir) / "pyproject.toml"
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(path, [f"invalid TOML: {exc}"]) from exc
    deps = data.get("project", {}).get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ManifestError(
            path, ["project.dependencies must be a list of requirement strings, e.g. ['numpy>=2']"]
        )
    return list(deps)


def load_environment(manifest: Manifest) -> type[Environment[Any, Any, Any]]:
    """The Environment class the manifest's entry point names.

    A class is returned as is; a factory is called once (without arguments) and its
    result's class is returned.

    Raises:
        TargetError: the entry point cannot be imported (an ``ImportError``).
        TypeError: it names neither an Environment subclass nor a factory returning one.
    """
    obj = load_target(manifest.entry_point, search_path=manifest.root)
    if isinstance(obj, type) and issubclass(obj, Environment):
        return obj
    if callable(obj) and not isinstance(obj, type):
        made = obj()
        if isinstance(made, Environment):
            return type(made)
        raise TypeError(
            f"entry point {manifest.entry_point!r} is a factory that returned "
            f"{type(made).__name__}, not an Environment; return an instance of your Environment"
        )
    raise TypeError(
        f"entry point {manifest.entry_point!r} is {type(obj).__name__}, not an Environment "
        "subclass or a factory; point it at 'module:YourEnvironment'"
    )


def load_contract(manifest: Manifest) -> Contract:
    """The contract of the environment the manifest's entry point names.

    Raises:
        TargetError: the entry point cannot be imported (an ``ImportError``).
        TypeError: it names neither an Environment subclass nor a factory returning one.
    """
    return load_environment(manifest).contract()
