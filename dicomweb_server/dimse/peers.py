"""Peers file: the AE titles C-MOVE may send to, and where they listen.

JSON (``{"STORESCP": {"host": "10.0.0.5", "port": 104}}``) or TOML (a table per AE
title: ``[STORESCP]`` ``host = "10.0.0.5"`` ``port = 104``). PS3.4 C.4.2: a Move
Destination the SCP does not know fails with 0xA801. Each AE title must be a PS3.5 AE
value (1-16 characters, no backslash or control characters, not all spaces), each host a
host name or IP address, each port 1-65535: anything else is refused at start.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..config_values import PORT, ae_title_problem, host_problem


@dataclass(frozen=True, slots=True)
class Peer:
    ae_title: str
    host: str
    port: int


class PeersError(ValueError):
    """The peers file cannot be read or holds a malformed entry."""


def load_peers(path: Path | None) -> dict[str, Peer]:
    """AE title -> :class:`Peer`; empty when no file is configured."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text("utf-8")
        raw = tomllib.loads(text) if Path(path).suffix.lower() == ".toml" else json.loads(text)
    except (OSError, ValueError) as e:
        raise PeersError(f"peers file {path}: {e}") from None
    if not isinstance(raw, dict):
        raise PeersError(f"peers file {path}: expected an object of AE title -> {{host, port}}")
    peers: dict[str, Peer] = {}
    for ae, entry in raw.items():
        if not isinstance(entry, dict):
            raise PeersError(f"peers file {path}: {ae!r}: expected {{host, port}}")
        if problem := ae_title_problem(ae):  # PS3.5 §6.2 AE
            raise PeersError(f"peers file {path}: {problem}")
        for name, problem in (("host", host_problem(entry.get("host"))), ("port", PORT.problem(entry.get("port")))):
            if problem:
                raise PeersError(f"peers file {path}: {ae!r}: {name}: {problem}")
        if ae.strip() in peers:
            raise PeersError(f"peers file {path}: {ae!r}: given twice (leading and trailing spaces of an AE "
                             "title are not significant)")
        peers[ae.strip()] = Peer(ae.strip(), entry["host"], entry["port"])
    return peers
