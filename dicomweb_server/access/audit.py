"""The audit log (JSON lines: who did what to which study, when, from where, the outcome)
and the JSON files credentials and rules are read from: what both front doors (api/auth.py,
dimse/) and the command line share, kept below them so that the DIMSE listener process
imports no web layer."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

audit_log = logging.getLogger("dicomweb_server.audit")


def load_json_file(path: Path | None) -> dict:
    if path is None:
        return {}
    return orjson.loads(Path(path).read_bytes())


def configure_audit_file(path: Path) -> None:
    """Send the audit logger to ``path`` (JSON lines, appended)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    for old in list(audit_log.handlers):
        if isinstance(old, logging.FileHandler) and Path(old.baseFilename) == Path(path).resolve():
            return
    audit_log.addHandler(handler)
    audit_log.setLevel(logging.INFO)
    audit_log.propagate = False
