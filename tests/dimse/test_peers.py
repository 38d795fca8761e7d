"""The peers file (C-MOVE destinations, and with authentication configured the peers allowed
and their scopes: dimse/access.py): JSON or TOML; malformed entries refused."""

from __future__ import annotations

import pytest

from dicomweb_server.cli import main
from dicomweb_server.dimse.peers import Peer, PeersError, load_peers


def test_json_and_toml(tmp_path):
    j = tmp_path / "peers.json"
    j.write_text('{"STORESCP": {"host": "10.0.0.5", "port": 104}}')
    t = tmp_path / "peers.toml"
    t.write_text('[STORESCP]\nhost = "10.0.0.5"\nport = 104\n')
    assert load_peers(j) == load_peers(t) == {"STORESCP": Peer("STORESCP", "10.0.0.5", 104)}
    assert load_peers(None) == {}


def test_scopes_and_an_optional_port(tmp_path):
    p = tmp_path / "peers.toml"
    p.write_text('[CT1]\nhost = "10.0.0.7"\nscopes = ["write"]\n[WS]\nhost = "ws.example"\nport = 11112\n'
                 'scopes = ["read", "write"]\n')
    assert load_peers(p) == {"CT1": Peer("CT1", "10.0.0.7", None, frozenset({"write"})),
                             "WS": Peer("WS", "ws.example", 11112, frozenset({"read", "write"}))}


def test_retrieve_method(tmp_path):
    """How a pull retrieves from the peer (dimse/pull.py): C-MOVE unless it says C-GET."""
    p = tmp_path / "peers.toml"
    p.write_text('[PACS]\nhost = "10.0.0.5"\nport = 104\nretrieve_method = "C-GET"\n[OTHER]\nhost = "h"\nport = 1\n')
    assert [(peer.ae_title, peer.retrieve_method) for peer in load_peers(p).values()] == [("PACS", "C-GET"),
                                                                                         ("OTHER", "C-MOVE")]


@pytest.mark.parametrize("text", ['{"A": {"port": 104}}', '{"A": {"host": "h", "port": 0}}', "[1]", "{",
                                  '{"A": {"host": "h", "port": "104"}}', '{"A": {"host": "", "port": 104}}',
                                  '{"A": {"host": "h", "scopes": ["delete"]}}',
                                  '{"A": {"host": "h", "scopes": "read"}}',
                                  '{"WAYTOOLONGAETITLE17": {"host": "h", "port": 104}}',
                                  '{"A": {"host": "h", "port": 104, "retrieve_method": "C-FIND"}}'])
def test_malformed(tmp_path, text):
    p = tmp_path / "peers.json"
    p.write_text(text)
    with pytest.raises(PeersError):
        load_peers(p)


def test_serve_refuses_a_bad_peers_file(tmp_path, capsys, monkeypatch):
    p = tmp_path / "peers.json"
    p.write_text("{")
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"):
        monkeypatch.setenv(k, "1" if k == "MALLOC_ARENA_MAX" else "67108864")
    assert main(["serve", "--data-dir", str(tmp_path / "d"), "--dimse-peers-file", str(p)]) == 2
    assert "--dimse-peers-file" in capsys.readouterr().err
