"""``fleet_urls``: one URL per address a (headless Service) name resolves to."""

from __future__ import annotations

import pytest

from corral.providers.kubernetes.fleet import fleet_urls


def test_every_address_once_sorted() -> None:
    urls = fleet_urls("localhost", 8000)
    assert "http://127.0.0.1:8000" in urls
    assert urls == sorted(set(urls))
    assert all(u.endswith(":8000") for u in urls)


def test_literal_addresses_and_schemes() -> None:
    assert fleet_urls("127.0.0.1", 9) == ["http://127.0.0.1:9"]
    assert fleet_urls("::1", 9, scheme="https") == ["https://[::1]:9"]


def test_an_unknown_name_raises() -> None:
    with pytest.raises(OSError):
        fleet_urls("no-such-service.invalid", 8000)
