"""``corral schema lock | check | diff``: the schema lock file and compatibility in CI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from corral.cli import console as cli_console
from corral.contract.diff import Change, diff_schemas
from corral.contract.lock import LockCheck, LockError, SchemaLock, check_lock, read_lock, write_lock
from corral.contract.schema import Contract
from corral.providers.manifest import Manifest, load_contract

schema_app = typer.Typer(
    name="schema",
    help="Lock the contract's schemas and check changes against the lock (for CI).",
    no_args_is_help=True,
)

PathArg = Annotated[
    Path,
    typer.Argument(help="The environment's directory (or its corral.yaml / openenv.yaml)."),
]
LockOpt = Annotated[
    Path | None,
    typer.Option("--lock", help="The lock file (default: the manifest's schema_lock)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
TolerantOpt = Annotated[
    bool,
    typer.Option(
        "--tolerant-readers",
        help="Every client ignores unknown keys in observations and state, so fields added "
        "to them are compatible (by default they are breaking where the locked model "
        "forbids unknown keys).",
    ),
]


def _load(path: Path) -> tuple[Manifest, Contract]:
    manifest = cli_console.manifest(path)
    try:
        return manifest, load_contract(manifest)
    except (ImportError, TypeError) as exc:
        raise cli_console.fail(f"cannot load the environment: {exc}") from None


def _read(path: Path) -> SchemaLock:
    try:
        return read_lock(path)
    except LockError as exc:
        raise cli_console.fail(str(exc)) from None


def changes_table(changes: list[Change], title: str) -> Table:
    """A rich table of ``changes``, breaking ones first."""
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("severity")
    table.add_column("path", style="bold")
    table.add_column("change")
    table.add_column("breaks")
    table.add_column("why", overflow="fold")
    for change in sorted(changes, key=lambda c: not c.breaking):
        severity = "[red]BREAKING[/red]" if change.breaking else "[green]compatible[/green]"
        breaks = {"server": "server rejects", "client": "client decode"}.get(change.fails_at or "")
        table.add_row(
            severity, escape(change.path), change.kind.value, breaks or "", escape(change.message)
        )
    return table


def _change_json(change: Change) -> dict[str, Any]:
    return {
        "path": change.path,
        "kind": change.kind.value,
        "severity": change.severity.value,
        "direction": change.direction.value,
        "fails_at": change.fails_at,
        "message": change.message,
    }


def _report(result: LockCheck, as_json: bool) -> None:
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ok": result.ok,
                    "locked_version": result.lock.contract_version,
                    "current_version": result.current.contract_version,
                    "locked_fingerprint": result.lock.fingerprint,
                    "current_fingerprint": result.current.fingerprint,
                    "major_bumped": result.major_bumped,
                    "changes": [_change_json(c) for c in result.changes],
                },
                indent=2,
            )
        )
        return
    console = cli_console.output()
    title = (
        f"{result.current.name or 'contract'}: {result.lock.contract_version} (locked) -> "
        f"{result.current.contract_version} (current)"
    )
    if result.changes:
        console.print(changes_table(result.changes, title))
    else:
        console.print(f"{title}: no schema changes")


@schema_app.command("lock")
def lock_command(
    path: PathArg = Path("."), lock: LockOpt = None, tolerant_readers: TolerantOpt = False
) -> None:
    """Write the schema lock file from the current models."""
    manifest, contract = _load(path)
    target = lock or manifest.lock_path
    console = cli_console.output()
    if target.exists():
        try:
            previous = read_lock(target)
        except LockError:
            previous = None
        if previous is not None:
            result = check_lock(previous, contract, tolerant_readers=tolerant_readers)
            if result.breaking and not result.major_bumped:
                console.print(
                    f"[yellow]warning:[/yellow] {len(result.breaking)} breaking change(s) "
                    f"locked without a major version bump (contract {contract.version}); "
                    "clients of the previous lock will fail:"
                )
                console.print(changes_table(result.breaking, "breaking changes"))
    written = write_lock(contract, target)
    console.print(
        f"wrote {target} (contract {written.contract_version}, fingerprint {written.fingerprint})"
    )


@schema_app.command("check")
def check_command(
    path: PathArg = Path("."),
    lock: LockOpt = None,
    as_json: JsonOpt = False,
    tolerant_readers: TolerantOpt = False,
) -> None:
    """Compare the current models against the lock; exit 1 on a breaking change.

    A breaking change passes only when the contract version's major was bumped; then
    (or after compatible changes) run 'corral schema lock' to record the new contract.
    """
    manifest, contract = _load(path)
    result = check_lock(
        _read(lock or manifest.lock_path), contract, tolerant_readers=tolerant_readers
    )
    if "contract_version" in manifest.model_fields_set and (
        manifest.contract_version != contract.version
    ):
        # The manifest's version labels images and Spaces; one that disagrees with the
        # class's tells deployments the wrong contract.
        raise cli_console.fail(
            f"the environment's contract_version is {contract.version} but "
            f"{manifest.path.name if manifest.path else 'the manifest'} says "
            f"{manifest.contract_version}; set the same version "
            "in both",
            code=1,
        )
    _report(result, as_json)
    if as_json:
        raise typer.Exit(0 if result.ok else 1)
    console = cli_console.output()
    if not result.ok:
        console.print(
            f"[red]{len(result.breaking)} breaking change(s).[/red] Restore compatibility, or "
            f"bump the contract's major version (now {contract.version}) and run "
            "'corral schema lock'."
        )
        raise typer.Exit(1)
    if result.stale:
        reason = "the major version was bumped" if result.breaking else "compatible changes"
        console.print(f"ok ({reason}); run 'corral schema lock' to update the lock file.")
    else:
        console.print("ok: the models match the lock.")


@schema_app.command("diff")
def diff_command(
    path: PathArg = Path("."),
    lock: LockOpt = None,
    against: Annotated[
        Path | None,
        typer.Option(help="Compare the lock with this other lock file instead of the models."),
    ] = None,
    as_json: JsonOpt = False,
    tolerant_readers: TolerantOpt = False,
) -> None:
    """Print every change between the lock and the current models, classified."""
    if against is not None:
        old = _read(lock or cli_console.manifest(path).lock_path)
        new = _read(against)
        changes = diff_schemas(old.schemas, new.schemas, tolerant_readers=tolerant_readers)
        if as_json:
            typer.echo(json.dumps([_change_json(c) for c in changes], indent=2))
        elif changes:
            cli_console.output().print(
                changes_table(changes, f"{old.contract_version} -> {new.contract_version}")
            )
        else:
            cli_console.output().print("no schema changes")
        return
    manifest, contract = _load(path)
    old = _read(lock or manifest.lock_path)
    result = check_lock(old, contract, tolerant_readers=tolerant_readers)
    _report(result, as_json)
