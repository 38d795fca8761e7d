"""Peers file: the AE titles this archive knows, where they are, and what they may do.

JSON (``{"STORESCP": {"host": "10.0.0.5", "port": 104, "scopes": ["read"]}}``) or TOML (a
table per AE title: ``[STORESCP]`` ``host = "10.0.0.5"`` ``port = 104`` ``scopes = ["read"]``).

- ``host`` (required): where the peer is. A C-MOVE to it connects there; with authentication
  configured (:mod:`.access`), its associations must come from this host's address.
- ``port`` (optional): where it listens; a peer without one is no Move Destination
  (PS3.4 C.4.2: a Move Destination the SCP does not know fails with 0xA801).
- ``scopes`` (optional, default none): with authentication configured, what it may do over
  DIMSE: ``read`` (C-FIND, C-GET, C-MOVE), ``write`` (C-STORE). C-ECHO needs none.
- ``tls`` (optional, default false): a C-MOVE to it connects over DICOM TLS (PS3.15 Annex B,
  :mod:`.tls`), its certificate checked against ``tls_ca_file`` (default: the system's CAs)
  and its ``host``; ``tls_cert_file`` and ``tls_key_file``: this archive's client certificate.
- ``retrieve_method`` (optional, default ``"C-MOVE"``): how this archive pulls studies from
  the peer (dimse/pull.py): ``"C-MOVE"`` (the peer sends them to this archive's AE title on
  an association of its own: it must know that AE title as a move destination) or
  ``"C-GET"`` (the peer sends them on the pull's association, PS3.4 C.4.3).

Each AE title must be a PS3.5 AE value (1-16 characters, no backslash or control characters,
not all spaces), each host a host name or IP address, each port 1-65535: anything else is
refused at start.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..config_values import PORT, ae_title_problem, host_problem
from .tls import TlsClient, TlsError, parse_client

#: the scopes a peer may hold (the HTTP scopes, api/auth.py, that mean something over DIMSE)
PEER_SCOPES = ("read", "write")
#: how studies are pulled from a peer (PS3.4 C.4.2 C-MOVE, C.4.3 C-GET)
RETRIEVE_METHODS = ("C-MOVE", "C-GET")


@dataclass(frozen=True, slots=True)
class Peer:
    ae_title: str
    host: str
    port: int | None
    scopes: frozenset[str] = field(default_factory=frozenset)
    tls: TlsClient | None = None  # DICOM TLS to this peer (PS3.15 Annex B), None: plain TCP
    retrieve_method: str = "C-MOVE"  # how a pull retrieves from this peer (RETRIEVE_METHODS)


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
        raise PeersError(f"peers file {path}: expected an object of AE title -> {{host, port, scopes}}")
    peers: dict[str, Peer] = {}
    for ae, entry in raw.items():
        if not isinstance(entry, dict):
            raise PeersError(f"peers file {path}: {ae!r}: expected {{host, port, scopes}}")
        if problem := ae_title_problem(ae):  # PS3.5 §6.2 AE
            raise PeersError(f"peers file {path}: {problem}")
        port = entry.get("port")
        for name, problem in (("host", host_problem(entry.get("host"))),
                              ("port", PORT.problem(port) if "port" in entry else None)):
            if problem:
                raise PeersError(f"peers file {path}: {ae!r}: {name}: {problem}")
        if ae.strip() in peers:
            raise PeersError(f"peers file {path}: {ae!r}: given twice (leading and trailing spaces of an AE "
                             "title are not significant)")
        scopes = entry.get("scopes", [])
        if not isinstance(scopes, list) or not all(s in PEER_SCOPES for s in scopes):
            raise PeersError(f"peers file {path}: {ae!r}: scopes must be a list of "
                             f"{' and '.join(repr(s) for s in PEER_SCOPES)}, not {scopes!r}")
        try:
            tls = parse_client(entry)
        except TlsError as e:
            raise PeersError(f"peers file {path}: {ae!r}: {e}") from None
        method = entry.get("retrieve_method", "C-MOVE")
        if method not in RETRIEVE_METHODS:
            raise PeersError(f"peers file {path}: {ae!r}: retrieve_method must be "
                             f"{' or '.join(repr(m) for m in RETRIEVE_METHODS)}, not {method!r}")
        peers[ae.strip()] = Peer(ae.strip(), entry["host"].strip(), port, frozenset(scopes), tls, method)
    return peers
