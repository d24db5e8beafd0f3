"""``corral deploy k8s [PATH]``: a fleet's manifests; ``corral deploy nginx|haproxy``: a
front door for servers of your own; ``corral k8s gc``: sweep dead owners.

    corral build path/to/env && docker push ...
    corral deploy k8s path/to/env --image registry.example.com/corral-echo:0.1.0 \\
        --namespace rl --host envs.example.com | kubectl apply -f -
    corral deploy k8s path/to/env -o deploy/        # one file per object + kustomization.yaml

The objects are those of :mod:`corral.providers.kubernetes.manifests`. On stdout the
output is YAML only (what ``kubectl apply -f -`` reads); the summary goes to stderr.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from corral.cli import console as cli_console

deploy_app = typer.Typer(
    name="deploy",
    help="Render deployment manifests for a long-lived fleet of servers.",
    no_args_is_help=True,
)
k8s_app = typer.Typer(
    name="k8s",
    help="Kubernetes housekeeping: sweep what dead providers left.",
    no_args_is_help=True,
)


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors: shared label dicts are written out, as kubectl shows them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)


@deploy_app.command("k8s")
def deploy_k8s(
    path: Annotated[
        Path, typer.Argument(help="The environment's directory (or its corral.yaml).")
    ] = Path("."),
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write one file per object (and kustomization.yaml) here."
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(help="The image (default: corral build's tag, corral-NAME:VERSION)."),
    ] = None,
    namespace: Annotated[str | None, typer.Option(help="Set on every object.")] = None,
    min_replicas: Annotated[
        int, typer.Option(help="The autoscaler's minimum (the Deployment sets no count).")
    ] = 2,
    max_replicas: Annotated[int, typer.Option(help="The autoscaler's maximum.")] = 10,
    disruption_budget: Annotated[
        bool,
        typer.Option(
            "--disruption-budget/--no-disruption-budget",
            help="A PodDisruptionBudget (one Pod at a time; needs --min-replicas 2 or more).",
        ),
    ] = True,
    target_cpu: Annotated[int, typer.Option(help="Average CPU % of the request to aim at.")] = 70,
    target_sessions: Annotated[
        float | None,
        typer.Option(help="Average active sessions per Pod to aim at (default: 80% of max)."),
    ] = None,
    drain: Annotated[
        float, typer.Option(help="Seconds a stopping Pod keeps serving its open sessions.")
    ] = 300.0,
    host: Annotated[
        str | None, typer.Option(help="Ingress (or HTTPRoute) host name; no Ingress without.")
    ] = None,
    ingress_class: Annotated[str | None, typer.Option(help="The Ingress class.")] = None,
    ingress_controller: Annotated[
        str,
        typer.Option(help="Whose annotations the Ingress carries: nginx, haproxy, traefik, none."),
    ] = "nginx",
    tls_secret: Annotated[str | None, typer.Option(help="TLS Secret for the host.")] = None,
    gateway: Annotated[
        str | None,
        typer.Option(help="A Gateway (NAME or NAMESPACE/NAME): an HTTPRoute instead of Ingress."),
    ] = None,
    websocket_timeout: Annotated[
        int, typer.Option(help="Seconds a WebSocket may stay silent at the ingress.")
    ] = 3600,
    router: Annotated[
        bool,
        typer.Option(
            "--router/--no-router",
            help="A Pod router behind the Ingress/HTTPRoute: the corral-server header reaches "
            "the Pod holding a client's sessions (the servers' id is their Pod IP).",
        ),
    ] = False,
    egress: Annotated[
        bool, typer.Option("--egress/--no-egress", help="Allow outbound traffic from servers.")
    ] = False,
    allow_from: Annotated[
        list[str] | None,
        typer.Option(help="A namespace whose Pods may reach the servers (repeatable)."),
    ] = None,
    prepull: Annotated[
        bool, typer.Option("--prepull/--no-prepull", help="The image pre-pull DaemonSet.")
    ] = True,
    monitoring: Annotated[
        bool,
        typer.Option(
            "--monitoring/--no-monitoring", help="ServiceMonitor and PrometheusRule objects."
        ),
    ] = True,
    agent_sandbox: Annotated[
        int,
        typer.Option(help="Warm Pods of an agent-sandbox SandboxWarmPool (0: none)."),
    ] = 0,
    token_secret: Annotated[
        str | None,
        typer.Option(help="A Secret holding the bearer token under the key 'token'."),
    ] = None,
    runtime_class: Annotated[
        str | None, typer.Option(help="RuntimeClass of the server Pods (gvisor, kata).")
    ] = None,
    sandbox: Annotated[
        str,
        typer.Option(
            help="For an env that sandboxes code (coding): none, namespaces (a user-namespaced "
            "Pod that may create namespaces) or runtime-class (--runtime-class is the "
            "boundary; the weak mode is allowed inside). See docs/scaling.md."
        ),
    ] = "none",
    pull_secret: Annotated[
        list[str] | None, typer.Option(help="Image pull Secret (repeatable).")
    ] = None,
    cpu_limit: Annotated[
        bool,
        typer.Option("--cpu-limit/--no-cpu-limit", help="Limit CPU to the request."),
    ] = True,
    node_selector: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE a node must carry (repeatable).")
    ] = None,
    toleration: Annotated[
        list[str] | None,
        typer.Option(help="A taint to tolerate, KEY[=VALUE][:EFFECT] (repeatable)."),
    ] = None,
) -> None:
    """Render the Kubernetes manifests of a fleet serving the environment at PATH."""
    # Imported here: every corral command (corral serve too) imports this module.
    from corral.providers.kubernetes.manifests import (
        FleetOptions,
        file_name,
        fleet_warnings,
        kustomization,
        render_fleet,
    )

    manifest = cli_console.manifest(path)
    try:
        options = FleetOptions(
            image=image,
            namespace=namespace,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            disruption_budget=disruption_budget,
            target_cpu=target_cpu,
            target_sessions=target_sessions,
            drain_seconds=drain,
            host=host,
            ingress_class=ingress_class,
            ingress_controller=ingress_controller,
            tls_secret=tls_secret,
            gateway=gateway,
            websocket_timeout=websocket_timeout,
            router=router,
            egress=egress,
            allow_from=tuple(allow_from or ()),
            prepull=prepull,
            monitoring=monitoring,
            agent_sandbox=agent_sandbox,
            token_secret=token_secret,
            runtime_class=runtime_class,
            sandbox=sandbox,
            image_pull_secrets=tuple(pull_secret or ()),
            cpu_limit=cpu_limit,
            node_selector=dict(_pair(s, "--node-selector") for s in node_selector or ()),
            tolerations=tuple(_toleration(t) for t in toleration or ()),
        )
    except ValueError as exc:
        raise cli_console.fail(str(exc)) from None
    objects = render_fleet(manifest, options)
    source = manifest.path.name if manifest.path else "corral.yaml"
    header = (
        f"# Generated by corral deploy k8s from {source} ({manifest.name} {manifest.version}).\n"
    )
    err = cli_console.errors()
    if output is None:
        sys.stdout.write(header + "".join(f"---\n{_dump(obj)}" for obj in objects))
    else:
        output.mkdir(parents=True, exist_ok=True)
        files = [file_name(i, obj) for i, obj in enumerate(objects)]
        for name, obj in zip(files, objects, strict=True):
            (output / name).write_text(header + _dump(obj))
        (output / "kustomization.yaml").write_text(header + _dump(kustomization(files)))
        err.print(f"wrote {len(files)} manifests and kustomization.yaml to {escape(str(output))}")
    kinds = ", ".join(str(o["kind"]) for o in objects)
    err.print(f"[dim]{manifest.name}: {kinds}[/dim]")
    for warning in fleet_warnings(options):
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if options.monitoring:
        err.print(
            "[dim]the autoscaler's sessions metric needs the custom metrics API "
            "(e.g. prometheus-adapter); see docs/scaling.md[/dim]"
        )


def _pair(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{option} takes KEY=VALUE, got {text!r}")
    return key, value


def _toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE][:EFFECT]`` as a toleration (Equal with a value, else Exists)."""
    body, _, effect = text.partition(":")
    key, sep, value = body.partition("=")
    if not key:
        raise ValueError(f"--toleration takes KEY[=VALUE][:EFFECT], got {text!r}")
    found = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        found["value"] = value
    if effect:
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(
                f"a toleration's effect is NoSchedule, PreferNoSchedule or "
                f"NoExecute, not {effect!r}"
            )
        found["effect"] = effect
    return found


def _front_door(kind: str, server: list[str] | None, output: Path | None, render: Any) -> None:
    from corral.providers.frontdoor import Backend, FrontDoorError

    if not server:
        raise cli_console.fail(
            f"give every server behind the {kind} front door: --server ID=HOST:PORT"
        )
    try:
        text = render([Backend.parse(s) for s in server])
    except FrontDoorError as exc:
        raise cli_console.fail(str(exc)) from None
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        cli_console.errors().print(f"wrote the {kind} configuration to {escape(str(output))}")


_SERVER_HELP = "A server behind the door, ID=HOST:PORT (repeatable; ID is its --server-id)."


@deploy_app.command("nginx")
def deploy_nginx(
    server: Annotated[list[str] | None, typer.Option(help=_SERVER_HELP)] = None,
    listen: Annotated[str, typer.Option(help="Where nginx listens, HOST:PORT.")] = "0.0.0.0:80",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write it here.")] = None,
    snippet: Annotated[
        bool,
        typer.Option(
            "--snippet/--standalone",
            help="Only what goes inside http {} (to include), or a whole nginx.conf.",
        ),
    ] = True,
    websocket_timeout: Annotated[
        int, typer.Option(help="Seconds a WebSocket may stay silent at the door.")
    ] = 3600,
) -> None:
    """Render an nginx front door that routes each client to its sessions' server."""
    from corral.providers.frontdoor import render_nginx

    _front_door(
        "nginx",
        server,
        output,
        lambda backends: render_nginx(
            backends,
            listen=listen,
            websocket_timeout_s=websocket_timeout,
            standalone=not snippet,
        ),
    )


@deploy_app.command("haproxy")
def deploy_haproxy(
    server: Annotated[list[str] | None, typer.Option(help=_SERVER_HELP)] = None,
    listen: Annotated[str, typer.Option(help="Where HAProxy listens, HOST:PORT.")] = "0.0.0.0:80",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write it here.")] = None,
    websocket_timeout: Annotated[
        int, typer.Option(help="Seconds a WebSocket may stay silent at the door.")
    ] = 3600,
) -> None:
    """Render an HAProxy front door that routes each client to its sessions' server."""
    from corral.providers.frontdoor import render_haproxy

    _front_door(
        "haproxy",
        server,
        output,
        lambda backends: render_haproxy(
            backends, listen=listen, websocket_timeout_s=websocket_timeout
        ),
    )


@k8s_app.command("gc")
def k8s_gc(
    namespace: Annotated[
        str | None, typer.Option(help="The namespace (default: the context's).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="The kubeconfig context.")] = None,
    kubeconfig: Annotated[str | None, typer.Option(help="The kubeconfig file.")] = None,
    owner: Annotated[
        str | None,
        typer.Option(help="Sweep this owner's objects even if its Lease is live."),
    ] = None,
    agent_sandbox: Annotated[
        bool,
        typer.Option(
            "--agent-sandbox",
            help="Also sweep SandboxClaims of owners whose Lease is gone (those of an "
            "expired agent-sandbox Lease are swept anyway).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be deleted; delete nothing.")
    ] = False,
) -> None:
    """Delete the Pods, SandboxClaims, Secrets and Leases of providers that died.

    Only the kinds the dead owners' modes created are listed, so the Role of those
    providers (corral k8s role) is enough; a kind this Role may not touch is reported
    and the rest is swept (exit code 1).
    """
    try:
        from corral.providers.kubernetes.api import KubeError, claims, connect
        from corral.providers.kubernetes.gc import kinds_of, sweep
    except ImportError as exc:
        raise cli_console.fail(str(exc)) from None

    async def run() -> Any:
        api = await connect(namespace=namespace, kubeconfig=kubeconfig, context=context)
        kinds = None
        if agent_sandbox:
            kinds = [*kinds_of("pods"), claims()]
        try:
            return api.namespace, await sweep(api, owner=owner, kinds=kinds, dry_run=dry_run)
        finally:
            await api.close()

    try:
        where, swept = asyncio.run(run())
    except KubeError as exc:
        raise cli_console.fail(str(exc), code=1) from None
    console = cli_console.output()
    verb = "would delete" if dry_run else "deleted"
    if not swept.total:
        console.print(f"nothing to sweep in namespace {where}")
    else:
        table = Table(title=f"{verb} in namespace {where}")
        table.add_column("kind")
        table.add_column("name")
        for kind, names in swept.objects.items():
            for name in names:
                table.add_row(kind, name)
        console.print(table)
        console.print(f"{verb} {swept.total} objects of {len(swept.owners)} dead owners")
    if swept.refused:
        for plural, message in swept.refused.items():
            cli_console.fail(f"cannot sweep {plural}: {message}", code=1)
        raise typer.Exit(1)


@k8s_app.command("role")
def k8s_role(
    mode: Annotated[
        str,
        typer.Option(
            help="pods (KubernetesProvider), agent-sandbox (AgentSandboxProvider), fleet "
            "(EndpointSliceFleet) or deletion-cost (corral k8s deletion-cost)."
        ),
    ] = "pods",
    namespace: Annotated[str | None, typer.Option(help="Set on every object.")] = None,
    name: Annotated[str, typer.Option(help="The Role's name.")] = "corral-provider",
    service_account: Annotated[
        str | None, typer.Option(help="Bind the Role to this service account.")
    ] = None,
    user: Annotated[str | None, typer.Option(help="Bind the Role to this user.")] = None,
) -> None:
    """Print the least-privilege Role (and a RoleBinding) of a corral mode, as YAML."""
    from corral.providers.kubernetes import rbac

    if mode not in rbac.MODES:
        raise cli_console.fail(f"--mode must be one of {', '.join(rbac.MODES)}, not {mode!r}")
    objects = [rbac.role(name, mode, namespace=namespace)]
    subjects = []
    if service_account is not None:
        subjects.append(rbac.service_account_subject(service_account, namespace))
    if user is not None:
        subjects.append({"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"})
    if subjects:
        objects.append(rbac.role_binding(name, name, subjects, namespace=namespace))
    sys.stdout.write("".join(f"---\n{_dump(obj)}" for obj in objects))


@k8s_app.command("deletion-cost")
def k8s_deletion_cost(
    selector: Annotated[
        str, typer.Option(help="The fleet's Pods, e.g. app.kubernetes.io/name=corral-echo.")
    ],
    namespace: Annotated[
        str | None, typer.Option(help="The namespace (default: the context's).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="The kubeconfig context.")] = None,
    kubeconfig: Annotated[str | None, typer.Option(help="The kubeconfig file.")] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="A file holding the servers' bearer token.")
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between rounds.")] = 10.0,
    once: Annotated[bool, typer.Option("--once", help="One round, then exit.")] = False,
) -> None:
    """Keep each server Pod's pod-deletion-cost at its active sessions (scale-down takes
    idle Pods first). Needs the Role of corral k8s role --mode deletion-cost."""
    from corral.auth import read_token_file
    from corral.providers.kubernetes.api import KubeError
    from corral.providers.kubernetes.deletion_cost import DeletionCostKeeper

    token = read_token_file(token_file) if token_file is not None else None
    keeper = DeletionCostKeeper(
        selector,
        token=token,
        interval=interval,
        namespace=namespace,
        kubeconfig=kubeconfig,
        context=context,
    )

    async def run() -> None:
        try:
            if once:
                for pod, cost in (await keeper.sync_once()).items():
                    print(f"{pod}: {cost}")
            else:
                await keeper.run_forever()
        finally:
            await keeper.close()

    try:
        asyncio.run(run())
    except KubeError as exc:
        raise cli_console.fail(str(exc), code=1) from None
