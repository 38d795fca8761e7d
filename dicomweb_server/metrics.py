"""Prometheus metrics, served at ``/metrics`` (outside the DICOMweb prefix).

Counters and the delivery latency histogram are kept per process; when a node
serves from several processes (uvicorn workers, the DIMSE listener process) the
server runs prometheus-client's multi-process mode (``PROMETHEUS_MULTIPROC_DIR``: a
temporary folder of this node on local disk, set by ``dicomweb-server serve``
before the other processes start, cli.py ``_metrics_dir``), so any worker's answer
sums all of the node's processes, and only them. The queue gauges are read from
the outbox table at scrape time: one truth for every worker and node.
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST

STORED = Counter("dicomweb_instances_stored", "Instances newly stored, through any front door")
INDEX_COMMITS = Counter("dicomweb_index_commits", "Durable index commits of stored instances (one per group commit)")
FORWARDED = Counter("dicomweb_forwarded", "Instances delivered to a destination", ["destination"])
FORWARD_FAILED = Counter("dicomweb_forward_failed", "Instances given up on (dead letter)", ["destination"])
INSTANCE_DATA_MISSING = Counter(
    "dicomweb_instance_data_missing",
    "Reads that found an indexed instance's stored file or object gone or unreadable (missing_data.py)")
RETENTION_REMOVED = Counter("dicomweb_retention_studies_removed", "Studies removed by the retention policy "
                            "(policy/retention.py)", ["action", "reason"])
FORWARD_RETRIES = Counter("dicomweb_forward_retries", "Deliveries of an instance to be tried again", ["destination"])
DELIVERY_LATENCY = Histogram(
    "dicomweb_delivery_latency_seconds", "From stored (outbox row committed) to delivered", ["destination"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 21600, 86400))


class _QueueCollector:
    """Outbox rows per destination and state, and the oldest pending row's age."""

    def __init__(self, outbox) -> None:
        self.outbox = outbox

    def collect(self):
        rows = GaugeMetricFamily("dicomweb_outbox_rows", "Outbox rows per destination and state",
                                 labels=["destination", "state"])
        oldest = GaugeMetricFamily("dicomweb_outbox_oldest_pending_seconds",
                                   "Age of the oldest pending forward", labels=["destination"])
        for dest, s in self.outbox.stats().items():
            for state in ("pending", "in_flight", "delivered", "failed"):
                rows.add_metric([dest, state], s[state] or 0)
            oldest.add_metric([dest], s["oldest_pending_age"] or 0.0)
        yield rows
        yield oldest


def render(outbox=None) -> bytes:
    """The exposition text: process (or all workers') metrics plus the queue gauges."""
    if MULTIPROC_ENV in os.environ:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    out = generate_latest(registry)
    if outbox is not None:
        queue = CollectorRegistry(auto_describe=False)
        queue.register(_QueueCollector(outbox))
        out += generate_latest(queue)
    return out
