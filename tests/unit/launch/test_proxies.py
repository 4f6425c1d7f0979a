"""Unit tests for paddle_dist.launch.proxies: which hosts a proxy setting leaves alone."""

from __future__ import annotations

import os

import pytest

from paddle_dist.launch.proxies import bypasses_proxy


@pytest.mark.parametrize("host, no_proxy", [
    ("10.0.0.1", "10.0.0.1"), ("10.0.0.1", "10.0.0.0/8"), ("10.0.0.1", ".0.0.1"),
    ("10.0.0.1", "10.0.0.1:80"), ("10.0.0.1", "10.0.0.1:6170"), ("10.0.0.11", "10.0.0.1"),
    ("node0.lab", ".lab"), ("lab", ".lab"), ("node0.lab", "lab"), ("node0.xlab", "lab"),
    ("node0.lab", "*"), ("node0.lab", "other,*"), ("node0.lab", ""), ("localhost", "localhost"),
    ("10.0.0.1", "http://10.0.0.1"), ("10.0.0.1", "https://10.0.0.1"), ("10.0.0.1", " 10.0.0.1 "),
])
def test_no_proxy_rules_agree_with_httpx(monkeypatch, host, no_proxy):
    """Paddle's launcher talks to the master with httpx: our reading must be its reading."""
    httpx = pytest.importorskip("httpx")
    for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("no_proxy", no_proxy)
    with httpx.Client() as client:
        direct = client._transport_for_url(httpx.URL(f"http://{host}:6170/")) is client._transport
    assert bypasses_proxy(host, 6170, no_proxy) == direct
