"""A small Kubernetes for the provider tests: kmock's API emulator and a fake kubelet.

No API server can run on these machines, so the tests use PyPI's ``kmock``: an
in-memory emulator of the Kubernetes API (create, get, list, watch, patch, delete of any
resource, custom ones included), served over real HTTP on 127.0.0.1. On top of it:

* :class:`FakeKubelet` watches the Pods through the API, like a kubelet, and runs each
  one for real: the container's command (``corral serve ...``) in a local process
  listening on the Pod's own loopback address (``127.x.y.z``, one per Pod, as Pods have
  IPs of their own) and port; it probes the Pod's readiness probe (``httpGet``, the
  only kind corral renders), and patches the Pod's status (``Pending`` with
  ``ContainerCreating``, ``Running`` and ``Ready``, ``Failed`` with the exit code) through
  the API. Images named ``unpullable/...`` end in ``ImagePullBackOff`` and images named
  ``unschedulable/...`` stay unschedulable, with the kubelet's and the scheduler's real
  reasons and messages. Deleting a Pod stops its process.
* :class:`Emulator` adds the two subresources kmock does not emulate: ``pods/log`` (the
  process's output) and ``pods/portforward`` (a ``v4.channel.k8s.io`` WebSocket bridged
  to the Pod's server), so that the port-forward connection mode runs end to end.

What this cannot show: a real scheduler, image pulls, cgroup limits (an OOM kill is a
status the verdict tests feed in), label selectors applied by the server (kmock ignores
them; the provider re-checks labels itself), resource versions, and the cluster's
garbage collector (owner references are set but nothing acts on them here).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import sys
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import aiohttp.web
import httpx
import kmock
from kubernetes_asyncio import client as k8s
from tests.support.kube_rbac import RBAC_RESOURCES, Authorizer, attributes, forbidden

from corral.providers.docker import _pid_alive
from corral.providers.kubernetes.api import PODS, SECRETS, Kind, KubeAPI, KubeError, connect

RESOURCES = ("v1/pods", "v1/secrets", "coordination.k8s.io/v1/leases")

FLEET_KINDS = {
    "v1/services": "Service",
    "apps/v1/deployments": "Deployment",
    "apps/v1/daemonsets": "DaemonSet",
    "autoscaling/v2/horizontalpodautoscalers": "HorizontalPodAutoscaler",
    "policy/v1/poddisruptionbudgets": "PodDisruptionBudget",
    "networking.k8s.io/v1/networkpolicies": "NetworkPolicy",
    "networking.k8s.io/v1/ingresses": "Ingress",
    "gateway.networking.k8s.io/v1/httproutes": "HTTPRoute",
    "monitoring.coreos.com/v1/servicemonitors": "ServiceMonitor",
    "monitoring.coreos.com/v1/prometheusrules": "PrometheusRule",
    "extensions.agents.x-k8s.io/v1beta1/sandboxtemplates": "SandboxTemplate",
    "extensions.agents.x-k8s.io/v1beta1/sandboxwarmpools": "SandboxWarmPool",
}
"""The resources ``corral deploy k8s`` renders, with their kinds (for kubectl's discovery)."""


def declare(emulator: kmock.KubernetesEmulator, kinds: Mapping[str, str]) -> None:
    """Declare namespaced resources with their kinds, as a cluster's discovery lists them."""
    for resource, kind in kinds.items():
        emulator.resources[resource] = {
            "kind": kind,
            "namespaced": True,
            "singular": kind.lower(),
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortnames": [],
            "categories": [],
            "subresources": [],
        }


NAMESPACE = "rl"


@dataclass(eq=False)
class RunningPod:
    """What the fake kubelet runs for one Pod."""

    name: str
    ip: str = ""
    port: int = 0
    process: asyncio.subprocess.Process | None = None
    output: deque[str] = field(default_factory=lambda: deque(maxlen=500))
    task: asyncio.Task[None] | None = None
    spawn: asyncio.Future[asyncio.subprocess.Process] | None = None
    reading: asyncio.Task[None] | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = None


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator with ``pods/log`` and ``pods/portforward`` (see the module docstring),
    the core group's discovery document as a real API server writes it, and RBAC for
    requests with a bearer token (:mod:`tests.support.kube_rbac`)."""

    kubelet: FakeKubelet | None = None
    authorizer: Authorizer | None = None

    def stored(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """``(group/version/plural, namespace, object)`` of every live stored object."""
        for (resource, namespace, _), obj in list(self.objects.items()):
            if not obj.deleted:
                path = "/".join(p for p in (resource.group, resource.version, resource.plural) if p)
                yield path, namespace or "", obj.raw

    def _authorise(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.Response | None:
        """None when the request may proceed, else the API server's 401 or 403."""
        header = request.headers.get("Authorization", "")
        if self.authorizer is None or not header:
            return None
        subject = self.authorizer.subject(header.removeprefix("Bearer ").strip())
        if subject is None:
            return aiohttp.web.json_response(
                {"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "bad token"},
                status=401,
            )
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        wanted = attributes(request.method, request.path, request.query, upgrade)
        if wanted is None or self.authorizer.decide(self.stored(), subject, wanted):
            return None
        return aiohttp.web.json_response(
            forbidden(self.authorizer.describe(subject), wanted), status=403
        )

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        refusal = self._authorise(raw_request)
        if refusal is not None:
            return refusal
        if raw_request.path == "/api/v1":
            return self._core_resources()
        parts = raw_request.path.strip("/").split("/")
        if self.kubelet is not None and len(parts) == 7 and parts[4] == "pods":
            pod = self.kubelet.pods.get(parts[5])
            if parts[6] == "log":
                return self._log(pod, raw_request)
            if parts[6] == "portforward":
                return await self._portforward(pod, raw_request)
        return await super().__call__(raw_request)

    def _core_resources(self) -> aiohttp.web.Response:
        """The core group's discovery document (kmock writes its groupVersion as "/v1")."""
        resources = []
        for resource in self.resources:
            if resource.group != "" or resource.version != "v1":
                continue
            info = self.resources[resource]
            resources.append(
                {
                    "name": resource.plural,
                    "kind": info.kind or str(resource.plural).capitalize(),
                    "singularName": info.singular or "",
                    "namespaced": info.namespaced if info.namespaced is not None else True,
                    "verbs": list(info.verbs),
                }
            )
        return aiohttp.web.json_response(
            {"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}
        )

    def _log(
        self, pod: RunningPod | None, request: aiohttp.web.BaseRequest
    ) -> aiohttp.web.Response:
        if pod is None:
            return aiohttp.web.json_response(
                {"kind": "Status", "code": 404, "reason": "NotFound", "message": "no such pod"},
                status=404,
            )
        lines = list(pod.output)
        tail = request.query.get("tailLines")
        if tail:
            lines = lines[-int(tail) :]
        return aiohttp.web.Response(text="".join(lines), content_type="text/plain")

    async def _portforward(
        self, pod: RunningPod | None, request: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        ws = aiohttp.web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)  # type: ignore[arg-type]
        port = int(request.query.get("ports", "0"))
        prefix = port.to_bytes(2, "little")
        if pod is None or not pod.ip:
            await ws.send_bytes(b"\x00" + prefix)
            await ws.send_bytes(b"\x01" + prefix + b"pod is not running")
            await ws.close()
            return ws
        try:
            reader, writer = await asyncio.open_connection(pod.ip, port)
        except OSError as exc:
            await ws.send_bytes(b"\x00" + prefix)
            await ws.send_bytes(b"\x01" + prefix + str(exc).encode())
            await ws.close()
            return ws
        await ws.send_bytes(b"\x00" + prefix)
        await ws.send_bytes(b"\x01" + prefix)

        async def to_pod() -> None:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY or message.data[:1] != b"\x00":
                    break
                writer.write(message.data[1:])
                await writer.drain()

        async def from_pod() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(b"\x00" + data)

        tasks = [asyncio.ensure_future(to_pod()), asyncio.ensure_future(from_pod())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()
        await ws.close()
        return ws


async def watch_forever(api: KubeAPI, kind: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``api.watch(kind)`` started over whenever its stream breaks (the emulator cuts it on
    a loaded machine), as a kubelet's or a controller's watch is: the new stream begins
    with an ADDED event per existing object, so its consumer must take repeats."""
    while True:
        try:
            async for event in api.watch(kind):
                yield event
        except (TimeoutError, KubeError, aiohttp.ClientError):
            await asyncio.sleep(0.1)


class FakeKubelet:
    """Runs the Pods of a namespace for real (see the module docstring).

    Args:
        api: an API client of the namespace.
        images: ``{image: its command}`` for images whose Pods set no command.
    """

    def __init__(self, api: KubeAPI, images: Mapping[str, Sequence[str]] | None = None) -> None:
        self.api = api
        self.images = dict(images or {})
        self.pods: dict[str, RunningPod] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        # One block of loopback addresses per kubelet: a Pod IP is never reused, and no
        # two kubelets (of this process or another test worker's) share a block, or their
        # Pods would bind the same address and port.
        self._block = _claim_block()
        self._ips = (f"127.{self._block}.{i // 250}.{i % 250 + 2}" for i in itertools.count())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fake-kubelet")

    async def _run(self) -> None:
        # Restarted watches replay the Pods as ADDED: running ones are kept.
        async for event, pod in watch_forever(self.api, PODS):
            self._on_pod(event, pod)

    def _on_pod(self, event: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if event == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            running = self.pods.pop(name, None)
            if running is not None:
                # A task of its own: closing the kubelet must not cut a stop short.
                stopping = asyncio.create_task(self._stop(running))
                self._stopping.add(stopping)
                stopping.add_done_callback(self._stopping.discard)
        elif name not in self.pods:
            running = RunningPod(name)
            self.pods[name] = running
            running.task = asyncio.create_task(self._run_pod(running, pod))

    async def _patch(self, name: str, status: Mapping[str, Any]) -> None:
        host = self.api.api_client.configuration.host
        url = f"{host}/api/v1/namespaces/{self.api.namespace}/pods/{name}/status"
        async with (
            aiohttp.ClientSession() as http,
            http.patch(url, json={"status": status}) as response,
        ):
            if response.status == 404:
                return
            response.raise_for_status()

    @staticmethod
    def _container_status(image: str, state: Mapping[str, Any], ready: bool) -> dict[str, Any]:
        return {
            "name": "server",
            "image": image,
            "imageID": "",
            "ready": ready,
            "started": "running" in state,
            "restartCount": 0,
            "state": dict(state),
        }

    async def _run_pod(self, running: RunningPod, pod: Mapping[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        image = container["image"]
        scheduled = {"type": "PodScheduled", "status": "True"}
        if image.startswith("unschedulable/"):
            await self._patch(
                running.name,
                {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 3 Insufficient cpu. "
                            "preemption: 0/3 nodes are available: 3 No preemption victims "
                            "found for incoming pod.",
                        }
                    ],
                },
            )
            return
        if image.startswith("unpullable/"):
            await self._patch(
                running.name,
                {
                    "phase": "Pending",
                    "conditions": [scheduled],
                    "containerStatuses": [
                        self._container_status(
                            image,
                            {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": f'Back-off pulling image "{image}"',
                                }
                            },
                            False,
                        )
                    ],
                },
            )
            return
        await self._patch(
            running.name,
            {
                "phase": "Pending",
                "conditions": [scheduled],
                "containerStatuses": [
                    self._container_status(
                        image, {"waiting": {"reason": "ContainerCreating"}}, False
                    )
                ],
            },
        )
        running.ip = next(self._ips)
        running.port = int(container["ports"][0]["containerPort"])
        running.tmp = tempfile.TemporaryDirectory(prefix="fake-pod-")
        command = list(container.get("command") or self.images[image])
        env = {**os.environ, **await self._env(container)}
        running.spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *self._argv(command, running),
                env=env,
                cwd=running.tmp.name,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        )
        # Shielded: a Pod deleted while its process starts must still find it to kill it.
        process = await asyncio.shield(running.spawn)
        running.process = process
        running.reading = reading = asyncio.create_task(self._read(running))
        running_state = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        base = {"hostIP": "127.0.0.1", "podIP": running.ip, "podIPs": [{"ip": running.ip}]}
        await self._patch(
            running.name,
            {
                **base,
                "phase": "Running",
                "conditions": [scheduled, {"type": "Ready", "status": "False"}],
                "containerStatuses": [self._container_status(image, running_state, False)],
            },
        )
        ready = False
        probe = container.get("readinessProbe") or {}
        while True:
            code = process.returncode
            if code is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 0.1)
                code = process.returncode
            if code is not None:
                await reading
                reason = "OOMKilled" if code == -signal.SIGKILL else "Error"
                await self._patch(
                    running.name,
                    {
                        **base,
                        "phase": "Failed",
                        "conditions": [scheduled, {"type": "Ready", "status": "False"}],
                        "containerStatuses": [
                            self._container_status(
                                image,
                                {
                                    "terminated": {
                                        "exitCode": 137 if code < 0 else code,
                                        "reason": reason,
                                    }
                                },
                                False,
                            )
                        ],
                    },
                )
                return
            passed = await self._probe(probe, running)
            if passed != ready:
                ready = passed
                await self._patch(
                    running.name,
                    {
                        **base,
                        "phase": "Running",
                        "conditions": [
                            scheduled,
                            {"type": "Ready", "status": "True" if ready else "False"},
                        ],
                        "containerStatuses": [self._container_status(image, running_state, ready)],
                    },
                )

    async def _env(self, container: Mapping[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            ref = item["valueFrom"]["secretKeyRef"]
            secret = await self.api.get(SECRETS, ref["name"]) or {}
            env[item["name"]] = str((secret.get("stringData") or {}).get(ref["key"], ""))
        return env

    @staticmethod
    def _argv(command: Sequence[str], running: RunningPod) -> list[str]:
        assert running.tmp is not None
        argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
        for flag, value in (("--host", running.ip), ("--port-file", f"{running.tmp.name}/url")):
            if flag in argv:
                argv[argv.index(flag) + 1] = value
        return argv

    async def _read(self, running: RunningPod) -> None:
        assert running.process is not None and running.process.stdout is not None
        async for line in running.process.stdout:
            running.output.append(line.decode("utf-8", errors="replace"))

    @staticmethod
    async def _probe(probe: Mapping[str, Any], running: RunningPod) -> bool:
        # httpGet only: the server's probes need no token (corral.server.http.PROBE_PATHS).
        url = f"http://{running.ip}:{running.port}{probe['httpGet']['path']}"
        try:
            async with httpx.AsyncClient(timeout=2, trust_env=False) as http:
                return (await http.get(url)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _stop(self, running: RunningPod) -> None:
        if running.task is not None:
            running.task.cancel()
            await asyncio.gather(running.task, return_exceptions=True)
        process = running.process
        if process is None and running.spawn is not None:
            with contextlib.suppress(Exception):
                process = await running.spawn
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        if running.reading is not None:
            # Read to the end: the process's transport closes once its pipe is drained.
            await asyncio.gather(running.reading, return_exceptions=True)
        elif process is not None and process.stdout is not None:
            await process.stdout.read()
        if running.tmp is not None:
            running.tmp.cleanup()

    def crash(self, name: str) -> None:
        """Kill the server of Pod ``name`` as a crash would (SIGKILL)."""
        process = self.pods[name].process
        assert process is not None
        os.killpg(process.pid, signal.SIGKILL)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*self._stopping, return_exceptions=True)
        await asyncio.gather(*(self._stop(p) for p in self.pods.values()))
        self.pods.clear()
        _release_block(self._block)


_BLOCKS = os.path.join(tempfile.gettempdir(), "corral-fake-kubelet-blocks")


def _claim_block() -> int:
    """A loopback block (the second octet) no live kubelet holds, claimed by creating its
    file exclusively; a block whose holder process is gone is taken over."""
    os.makedirs(_BLOCKS, exist_ok=True)
    candidates = list(range(16, 250))
    random.shuffle(candidates)
    for block in candidates:
        path = os.path.join(_BLOCKS, str(block))
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _holder_alive(path):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a dead holder's: retried below
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue  # another process took it over first
        with os.fdopen(fd, "w") as claim:
            claim.write(str(os.getpid()))
        return block
    raise RuntimeError(f"every fake-kubelet loopback block is held (see {_BLOCKS})")


def _holder_alive(path: str) -> bool:
    try:
        with open(path) as claim:
            pid = int(claim.read() or "0")
    except (OSError, ValueError):
        return True  # being written now: leave it to its writer
    return pid <= 0 or _pid_alive(pid)


def _release_block(block: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(_BLOCKS, str(block)))


@dataclass
class Cluster:
    """An emulated cluster with a kubelet (see the module docstring)."""

    emulator: Emulator
    kubelet: FakeKubelet
    api: KubeAPI
    url: str

    @property
    def namespace(self) -> str:
        return self.api.namespace

    def configuration(self) -> k8s.Configuration:
        """A client configuration for the emulator (no credentials)."""
        return k8s.Configuration(host=self.url)

    def objects(self, plural: str) -> list[dict[str, Any]]:
        """The live objects of a resource, as the emulator stores them."""
        return [
            obj.raw
            for (resource, _, _), obj in self.emulator.objects.items()
            if resource.plural == plural and not obj.deleted
        ]

    @property
    def authorizer(self) -> Authorizer:
        """The RBAC of a ``cluster(rbac=True)``."""
        assert self.emulator.authorizer is not None, "start the cluster with rbac=True"
        return self.emulator.authorizer

    async def apply(self, *objects: Mapping[str, Any]) -> None:
        """Create objects (Roles, RoleBindings, ...) as the cluster's admin."""
        for obj in objects:
            group, _, version = str(obj["apiVersion"]).rpartition("/")
            plural = f"{str(obj['kind']).lower()}s"
            await self.api.create(Kind(group, version, plural), obj)

    def user(self, name: str) -> str:
        """A bearer token authenticating user ``name`` (with no rights until bound)."""
        token = f"user-{name}-{random.getrandbits(48):012x}"
        self.authorizer.register(token, "User", name)
        return token

    def kubeconfig(self, path: str | os.PathLike[str], token: str | None = None) -> str:
        """Write a kubeconfig pointing at the emulator (with ``token``); return its path."""
        user: dict[str, Any] = {"token": token} if token is not None else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emu", "cluster": {"server": self.url}}],
            "users": [{"name": "me", "user": user}],
            "contexts": [
                {
                    "name": "emu",
                    "context": {"cluster": "emu", "user": "me", "namespace": self.namespace},
                }
            ],
            "current-context": "emu",
        }
        with open(path, "w") as out:
            json.dump(config, out)
        return str(path)


@contextlib.asynccontextmanager
async def cluster(
    images: Mapping[str, Sequence[str]] | None = None,
    resources: Sequence[str] = RESOURCES,
    *,
    rbac: bool = False,
) -> AsyncIterator[Cluster]:
    """An emulated cluster with a fake kubelet, for the duration of the block.

    With ``rbac``, requests carrying a bearer token are authorised by the Roles bound to
    its subject (:mod:`tests.support.kube_rbac`); the harness's own calls carry none.
    """
    async with Emulator() as emulator, kmock.Server(emulator) as server:
        for resource in (*resources, *(RBAC_RESOURCES if rbac else ())):
            emulator.resources[resource] = {}
        if rbac:
            emulator.authorizer = Authorizer()
        url = str(server.url).rstrip("/")
        api = await connect(namespace=NAMESPACE, configuration=k8s.Configuration(host=url))
        kubelet = FakeKubelet(api, images)
        emulator.kubelet = kubelet
        kubelet.start()
        try:
            yield Cluster(emulator, kubelet, api, url)
        finally:
            await kubelet.close()
            await api.close()


SANDBOX_RESOURCES = (
    "extensions.agents.x-k8s.io/v1beta1/sandboxclaims",
    "extensions.agents.x-k8s.io/v1beta1/sandboxwarmpools",
    "agents.x-k8s.io/v1beta1/sandboxes",
)


class FakeSandboxController:
    """agent-sandbox's controller, as far as claims of a warm pool go.

    It keeps ``size`` warm Pods of the pool's template running (the kubelet runs them),
    binds each new SandboxClaim of the pool to a ready one (a Sandbox naming the Pod,
    the claim's status ``Ready`` with the sandbox's name and Pod IPs), refills the pool,
    and deletes the sandbox and its Pod with the claim.
    """

    def __init__(self, api: KubeAPI, pool: Mapping[str, Any], template: Mapping[str, Any]) -> None:
        self.api = api
        self.pool = pool
        self.template = template
        self.name = str(pool["metadata"]["name"])
        self.bound: dict[str, str] = {}
        self._count = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._warm: asyncio.Queue[str] = asyncio.Queue()
        self.errors: list[Exception] = []

    async def start(self) -> None:
        from corral.providers.kubernetes.api import claims, warm_pools

        await self.api.create(warm_pools(), self.pool)
        for _ in range(int(self.pool["spec"]["replicas"])):
            await self._add_warm_pod()
        self._task = asyncio.create_task(self._run(claims()))

    async def _add_warm_pod(self) -> None:
        name = f"{self.name}-warm-{next(self._count)}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"agents.x-k8s.io/warm-pool-sandbox": self.name},
            },
            "spec": self.template["spec"]["podTemplate"]["spec"],
        }
        await self.api.create(PODS, pod)
        await self._warm.put(name)

    async def _ready_ip(self, pod: str) -> str:
        while True:
            found = await self.api.get(PODS, pod) or {}
            status = found.get("status") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if ready and status.get("podIP"):
                return str(status["podIP"])
            await asyncio.sleep(0.05)

    async def _run(self, kind: Any) -> None:
        # A controller outlives one failed claim: an error is kept for close() to raise
        # (a test then fails with its cause, not with a claim unbound until the timeout).
        # Restarted watches replay the claims as ADDED: bound ones are skipped.
        async for event, claim in watch_forever(self.api, kind):
            try:
                await self._handle(kind, event, claim)
            except Exception as exc:
                self.errors.append(exc)

    async def _handle(self, kind: Any, event: str, claim: dict[str, Any]) -> None:
        name = claim["metadata"]["name"]
        if event == "DELETED":
            await self._unbind(name)
            return
        if name in self.bound or claim.get("status"):
            return
        if claim["spec"].get("warmPoolRef", {}).get("name") != self.name:
            return
        pod = await self._warm.get()
        self.bound[name] = pod
        try:
            await self._bind(kind, name, pod)
        except KubeError as exc:
            if not exc.not_found:
                raise
            # The claim went while it was being bound (a cancelled start): as the real
            # controller does, its sandbox and Pod go with it.
            await self._unbind(name)
        await self._add_warm_pod()

    async def _unbind(self, name: str) -> None:
        from corral.providers.kubernetes.api import sandboxes

        pod = self.bound.pop(name, None)
        if pod is not None:
            await self.api.delete(sandboxes(), f"{name}-sandbox")
            await self.api.delete(PODS, pod)

    async def _bind(self, kind: Any, name: str, pod: str) -> None:
        from corral.providers.kubernetes.api import sandboxes

        ip = await self._ready_ip(pod)
        sandbox = f"{name}-sandbox"
        await self.api.create(
            sandboxes(),
            {
                "apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox",
                "metadata": {
                    "name": sandbox,
                    "annotations": {"agents.x-k8s.io/pod-name": pod},
                },
                "spec": self.template["spec"],
            },
        )
        await self.api.patch(
            kind,
            name,
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "DependenciesReady"}
                    ],
                    "sandbox": {"name": sandbox, "podIPs": [ip]},
                }
            },
        )

    async def close(self) -> None:
        """Stop the controller; raise what went wrong in it, if anything did."""
        if self._task is not None:
            self._task.cancel()
            (outcome,) = await asyncio.gather(self._task, return_exceptions=True)
            if isinstance(outcome, Exception):  # a bug of the controller itself
                self.errors.append(outcome)
        if self.errors:
            raise RuntimeError(f"the fake sandbox controller failed: {self.errors!r}")
