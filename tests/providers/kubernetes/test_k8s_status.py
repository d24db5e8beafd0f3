"""The verdict table: what a Pod's or a SandboxClaim's status means, on the API's real shapes."""

from __future__ import annotations

from typing import Any

import pytest

from corral.providers.kubernetes.status import claim_verdict, pod_verdict


def pod(status: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": "corral-echo-1", **metadata}, "status": status}


def waiting(reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": "server",
                "state": {"waiting": {"reason": reason, "message": message}},
                **extra,
            }
        ],
    }


READY = {
    "phase": "Running",
    "podIP": "10.1.2.3",
    "conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", "status": "True"},
        {"type": "Ready", "status": "True"},
    ],
    "containerStatuses": [
        {
            "name": "server",
            "ready": True,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        }
    ],
}


def test_ready_needs_the_ready_condition_and_an_ip() -> None:
    assert pod_verdict(pod(READY)).state == "ready"
    no_ip = {**READY, "podIP": None}
    assert pod_verdict(pod(no_ip)).state == "pending"
    not_ready = {
        **READY,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"},
        ],
    }
    verdict = pod_verdict(pod(not_ready))
    assert verdict.state == "pending" and verdict.reason == "waiting for /ready"


@pytest.mark.parametrize(
    ("reason", "hint"),
    [
        ("ImagePullBackOff", "cannot pull the image"),
        ("ErrImagePull", "cannot pull the image"),
        ("InvalidImageName", "not a valid reference"),
        ("CreateContainerConfigError", "missing Secret"),
    ],
)
def test_stuck_waiting_reasons_fail_at_once(reason: str, hint: str) -> None:
    verdict = pod_verdict(pod(waiting(reason, 'Back-off pulling image "corral-echo:9"')))
    assert verdict.state == "failed"
    assert verdict.reason == reason
    assert hint in verdict.hint
    assert reason in verdict.describe() and "Back-off pulling image" in verdict.describe()


def test_crash_loop_reports_the_last_exit_and_asks_for_the_previous_logs() -> None:
    status = waiting(
        "CrashLoopBackOff",
        "back-off 10s restarting failed container=server",
        lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
        restartCount=3,
    )
    verdict = pod_verdict(pod(status))
    assert verdict.state == "failed"
    assert verdict.reason == "CrashLoopBackOff (OOMKilled)"
    assert "raise resources.memory" in verdict.hint
    assert verdict.previous_logs


def test_crash_loop_without_a_last_state() -> None:
    verdict = pod_verdict(pod(waiting("CrashLoopBackOff")))
    assert verdict.state == "failed" and "exits as soon as it starts" in verdict.hint


def test_a_failed_pod_reports_its_container_exit() -> None:
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "server", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
        ],
    }
    verdict = pod_verdict(pod(status))
    assert (verdict.state, verdict.reason, verdict.message) == ("failed", "Error", "exit code 2")


def test_oom_killed() -> None:
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "server", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
        ],
    }
    verdict = pod_verdict(pod(status))
    assert verdict.reason == "OOMKilled" and "resources.memory" in verdict.hint


def test_evicted() -> None:
    status = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
    }
    verdict = pod_verdict(pod(status))
    assert (verdict.state, verdict.reason) == ("failed", "Evicted")
    assert "low on resource" in verdict.message


def test_a_running_container_that_terminated_is_failed_before_the_phase_says_so() -> None:
    status = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "server", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
        ],
    }
    assert pod_verdict(pod(status)).state == "failed"


def test_unschedulable() -> None:
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu.",
            }
        ],
    }
    verdict = pod_verdict(pod(status))
    assert verdict.state == "unschedulable"
    assert "Insufficient cpu" in verdict.message
    assert "lower resources.cpu" in verdict.hint


def test_pending_reasons() -> None:
    assert pod_verdict(pod({"phase": "Pending"})).reason == "Scheduling"
    assert pod_verdict(pod(waiting("ContainerCreating"))).reason == "ContainerCreating"
    assert pod_verdict(pod(waiting("ContainerCreating"))).state == "pending"


def test_gone() -> None:
    assert pod_verdict(None).state == "gone"
    terminating = pod(READY, deletionTimestamp="2026-01-01T00:00:00Z")
    assert pod_verdict(terminating).state == "gone"
    assert pod_verdict(terminating).done


def claim(
    conditions: list[dict[str, Any]], sandbox: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "c"},
        "status": {"conditions": conditions, "sandbox": sandbox or {}},
    }


def test_claim_verdicts() -> None:
    assert claim_verdict(None).state == "gone"
    assert claim_verdict({"metadata": {"name": "c"}}).state == "pending"
    ready = claim(
        [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}],
        {"name": "sb", "podIPs": ["10.0.0.9"]},
    )
    assert claim_verdict(ready).state == "ready"
    # Ready without the sandbox's IPs yet: still pending.
    assert claim_verdict(claim([{"type": "Ready", "status": "True"}])).state == "pending"
    transient = claim([{"type": "Ready", "status": "False", "reason": "SandboxNotReady"}])
    assert claim_verdict(transient).state == "pending"
    missing = claim(
        [{"type": "Ready", "status": "False", "reason": "TemplateNotFound", "message": "nope"}]
    )
    verdict = claim_verdict(missing)
    assert (verdict.state, verdict.reason, verdict.message) == (
        "failed",
        "TemplateNotFound",
        "nope",
    )
    assert "--agent-sandbox" in verdict.hint
