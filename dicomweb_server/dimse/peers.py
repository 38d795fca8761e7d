"""Peers file: the AE titles C-MOVE may send to, and where they listen.

JSON (``{"STORESCP": {"host": "10.0.0.5", "port": 104}}``) or TOML (a table per AE
title: ``[STORESCP]`` ``host = "10.0.0.5"`` ``port = 104``). PS3.4 C.4.2: a Move
Destination the SCP does not know fails with 0xA801.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path


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
        if not isinstance(entry, dict) or not isinstance(entry.get("host"), str) \
                or not isinstance(entry.get("port"), int) or not 0 < entry["port"] < 65536 \
                or not 0 < len(ae.strip()) <= 16:
            raise PeersError(f"peers file {path}: {ae!r} needs an AE title of 1-16 characters, "
                             "a host string and a port number")
        peers[ae.strip()] = Peer(ae.strip(), entry["host"], entry["port"])
    return peers
