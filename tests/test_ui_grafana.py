"""deploy/grafana/blobsvc.json asks only for what blobsvc exports: every query names metrics
that a real server's ``/metrics`` describes and blobsvc/server/metrics.py defines, with labels
those metrics carry."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from blobsvc import BlobClient, Settings

from .conftest import ServerThread

ROOT = Path(__file__).parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "blobsvc.json"
METRICS_SOURCE = (ROOT / "blobsvc" / "server" / "metrics.py").read_text()
# Described only by a server in zookeeper mode (HA's status source adds it).
ZOOKEEPER_ONLY = {"blobsvc_leader_changes"}
# Added by Prometheus to every series it scrapes, not by blobsvc.
SCRAPE_LABELS = {"instance", "job"}
_METRIC = re.compile(r"\b(blobsvc_[a-z0-9_]+)")
_SELECTOR = re.compile(r"(blobsvc_[a-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target


def _family(sample: str) -> str:
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Each sample name a real server's /metrics exposes (or describes) → its label names."""
    settings = Settings(
        host="127.0.0.1", port="0", http_port="0", metrics_port="http",
        data_dir=tmp_path_factory.mktemp("grafana") / "data", content_ttl=3600.0,
    )  # fmt: skip
    server = ServerThread(settings).start()
    try:
        with BlobClient(server.address, timeout=10) as client:
            client.get(client.put(b"some bytes"))
            client.heartbeat({"agent": "exec-1:6140"})
        address = server.server.http_address
        assert address is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{address[1]}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        server.stop()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
        for suffix in suffixes:
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_every_query_names_a_metric_blobsvc_exports_with_its_labels(exported: dict[str, set[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    targets = list(_targets(dashboard))
    assert len(targets) >= 20
    for title, target in targets:
        expr = target["expr"]
        metrics = set(_METRIC.findall(expr))
        assert metrics, f"{title}: {expr!r} names no blobsvc metric"
        for metric in metrics:
            assert f'"{_family(metric)}"' in METRICS_SOURCE, f"{title}: {metric} is not in blobsvc/server/metrics.py"
            if _family(metric) not in ZOOKEEPER_ONLY:
                assert metric in exported, f"{title}: {metric} is not in a server's /metrics"
        labels: set[str] = set()
        for metric in metrics:
            labels |= exported.get(metric, set())
        labels |= SCRAPE_LABELS
        for metric, matchers in _SELECTOR.findall(expr):
            for label in _MATCHER.findall(matchers):
                assert label in exported.get(metric, set()) | SCRAPE_LABELS, f"{title}: {metric} has no label {label}"
        grouped = {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}
        legend = set(_LEGEND.findall(target.get("legendFormat", "")))
        assert grouped | legend <= labels, f"{title}: {expr!r} groups or names labels its metrics lack"


def test_the_dashboard_has_the_pages_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == ["Overview", "Hosts", "Checkpoints", "Jobs and storage"]
    assert dashboard["uid"] == "blobsvc" and {v["name"] for v in dashboard["templating"]["list"]} == {
        "datasource",
        "instance",
    }
