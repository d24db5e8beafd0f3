"""What a Pod's (or a SandboxClaim's) status says about its server: the one verdict table.

The Kubernetes provider never polls: it watches its Pods and, on every event, asks
:func:`pod_verdict` what the new status means. Every path (starting, liveness, the warm
pool's health checks, the error a user reads) goes through this table, so that a Pod
is judged the same way everywhere:

====================  ===========================================================
verdict               when
====================  ===========================================================
``gone``              the Pod is being deleted (``deletionTimestamp``) or was deleted
``failed``            phase ``Failed``/``Succeeded`` (the server exited: ``OOMKilled``,
                      ``Error`` with its exit code, ``Evicted``); a container that
                      terminated; a container waiting for a reason it will not get
                      out of by itself (:data:`STUCK`: ``ImagePullBackOff``,
                      ``CrashLoopBackOff``, ...)
``unschedulable``     ``PodScheduled=False`` with reason ``Unschedulable`` (the
                      provider waits for a node up to its ``unschedulable_timeout``,
                      0 by default: reported at once)
``ready``             ``Ready=True`` and a Pod IP: the readiness probe (``/ready``)
                      passed
``pending``           anything else (scheduling, pulling, ``ContainerCreating``,
                      waiting for ``/ready``)
====================  ===========================================================

A failed verdict carries the reason, the kubelet's message and a hint on what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["pending", "ready", "unschedulable", "failed", "gone"]

STUCK: Mapping[str, str] = {
    "ImagePullBackOff": (
        "the cluster cannot pull the image: check its name and tag, that it was pushed "
        "(corral build, then docker push or corral push) and the imagePullSecrets"
    ),
    "ErrImagePull": (
        "the cluster cannot pull the image: check its name and tag, that it was pushed "
        "and the imagePullSecrets"
    ),
    "ErrImageNeverPull": "imagePullPolicy is Never and the node does not have the image",
    "InvalidImageName": "the image name is not a valid reference",
    "CrashLoopBackOff": "the server exits as soon as it starts; its last log lines follow",
    "CreateContainerConfigError": (
        "the container's configuration is invalid (a missing Secret or ConfigMap?)"
    ),
    "CreateContainerError": "the runtime could not create the container",
    "RunContainerError": "the runtime could not start the container",
}
"""Waiting reasons a container does not get out of by itself, with what to check."""

_EXIT_HINTS: Mapping[str, str] = {
    "OOMKilled": "the server used more memory than its limit: raise resources.memory",
    "Evicted": "the node evicted the Pod (it ran out of memory or disk)",
    "Error": "the server exited with an error; its last log lines follow",
    "Completed": "the server exited without an error, which it never does while serving",
}


@dataclass(frozen=True)
class Verdict:
    """What a status means for the server in it.

    Attributes:
        state: see the module's table.
        reason: the Kubernetes reason (``ImagePullBackOff``, ``OOMKilled``, ...), or a
            short description of what it waits for.
        message: the kubelet's or scheduler's message, if any.
        hint: what to fix, for a failure.
        previous_logs: the interesting logs are the previous container's (it restarted).
    """

    state: State
    reason: str = ""
    message: str = ""
    hint: str = ""
    previous_logs: bool = False

    @property
    def done(self) -> bool:
        """The server will not become ready: it failed or is gone."""
        return self.state in ("failed", "gone")

    def describe(self) -> str:
        """One line: the reason, the message and the hint."""
        parts = [self.reason or self.state]
        if self.message:
            parts.append(self.message)
        text = ": ".join(parts)
        return f"{text} ({self.hint})" if self.hint else text


def _conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    items: Sequence[Mapping[str, Any]] = status.get("conditions") or []
    return {str(c.get("type")): c for c in items if isinstance(c, Mapping)}


def _terminated(container: Mapping[str, Any], key: str = "state") -> Mapping[str, Any] | None:
    state = container.get(key) or {}
    terminated = state.get("terminated")
    return terminated if isinstance(terminated, Mapping) else None


def _exit(terminated: Mapping[str, Any], *, previous: bool = False) -> Verdict:
    reason = str(terminated.get("reason") or "Error")
    code = terminated.get("exitCode")
    message = str(terminated.get("message") or "").strip()
    if code is not None and reason != "OOMKilled":
        message = f"exit code {code}" + (f": {message}" if message else "")
    return Verdict(
        "failed",
        reason,
        message,
        _EXIT_HINTS.get(reason, "the server exited; its last log lines follow"),
        previous_logs=previous,
    )


def pod_verdict(pod: Mapping[str, Any] | None) -> Verdict:
    """What ``pod`` (a Pod as the API returns it, or None once deleted) says; see the table."""
    if pod is None:
        return Verdict("gone", "Deleted", "the Pod was deleted")
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return Verdict("gone", "Terminating", "the Pod is being deleted")
    status: Mapping[str, Any] = pod.get("status") or {}
    phase = status.get("phase")
    containers: Sequence[Mapping[str, Any]] = status.get("containerStatuses") or []
    if phase in ("Failed", "Succeeded"):
        for container in containers:
            terminated = _terminated(container)
            if terminated is not None:
                return _exit(terminated)
        reason = str(status.get("reason") or phase)
        return Verdict(
            "failed",
            reason,
            str(status.get("message") or ""),
            _EXIT_HINTS.get(reason, "the Pod stopped"),
        )
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in STUCK:
            last = _terminated(container, "lastState")
            if reason == "CrashLoopBackOff" and last is not None:
                crashed = _exit(last, previous=True)
                return Verdict(
                    "failed",
                    f"CrashLoopBackOff ({crashed.reason})",
                    crashed.message,
                    crashed.hint,
                    previous_logs=True,
                )
            return Verdict("failed", reason, str(waiting.get("message") or ""), STUCK[reason])
        terminated = _terminated(container)
        if terminated is not None:
            return _exit(terminated)
    conditions = _conditions(status)
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return Verdict(
            "unschedulable",
            "Unschedulable",
            str(scheduled.get("message") or ""),
            "no node has room for the Pod's requests: lower resources.cpu / "
            "resources.memory, or add nodes",
        )
    ready = conditions.get("Ready") or {}
    if ready.get("status") == "True" and status.get("podIP"):
        return Verdict("ready", "Ready")
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return Verdict("pending", str(waiting["reason"]), str(waiting.get("message") or ""))
    if not scheduled:
        return Verdict("pending", "Scheduling")
    return Verdict("pending", "waiting for /ready")


TERMINAL_CLAIM_REASONS: frozenset[str] = frozenset(
    {
        "TemplateNotFound",
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "ClaimExpired",
        "SandboxExpired",
        "InvalidConfiguration",
    }
)
"""``Ready=False`` reasons of a SandboxClaim that its controller does not recover from.

A missing warm pool is not one of them (the controller retries it): the provider checks
that the pool exists before it claims.
"""


def claim_verdict(claim: Mapping[str, Any] | None) -> Verdict:
    """What a SandboxClaim of kubernetes-sigs/agent-sandbox says about its sandbox.

    Ready means ``Ready=True`` and the sandbox's Pod IPs in ``status.sandbox``.
    """
    if claim is None:
        return Verdict("gone", "Deleted", "the SandboxClaim was deleted")
    if (claim.get("metadata") or {}).get("deletionTimestamp"):
        return Verdict("gone", "Terminating", "the SandboxClaim is being deleted")
    status: Mapping[str, Any] = claim.get("status") or {}
    ready = _conditions(status).get("Ready") or {}
    reason = str(ready.get("reason") or "")
    sandbox = status.get("sandbox") or {}
    if ready.get("status") == "True" and sandbox.get("podIPs"):
        return Verdict("ready", "Ready")
    if ready.get("status") == "False" and reason in TERMINAL_CLAIM_REASONS:
        return Verdict(
            "failed",
            reason,
            str(ready.get("message") or ""),
            "check the SandboxWarmPool and its SandboxTemplate (corral deploy k8s "
            "--agent-sandbox renders both)",
        )
    return Verdict("pending", reason or "waiting for the claim to be bound")
