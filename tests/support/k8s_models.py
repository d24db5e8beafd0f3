"""Kubernetes objects checked against the official client's typed models (``kubernetes``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the official client validates manifests")


def typed(data: dict[str, Any], model: str) -> Any:
    """``data`` loaded into the official client's model ``model`` (``"V1Pod"``).

    Unknown keys are dropped by the model: compare :func:`roundtrip` with ``data`` to
    prove there were none.
    """
    api = kubernetes.client.ApiClient()
    return api.deserialize(json.dumps(data), model, "application/json")


def roundtrip(data: dict[str, Any], model: str) -> dict[str, Any]:
    """``data`` through the typed model and back: equal to ``data`` only if every key is known."""
    api = kubernetes.client.ApiClient()
    result: dict[str, Any] = api.sanitize_for_serialization(typed(data, model))
    return result
