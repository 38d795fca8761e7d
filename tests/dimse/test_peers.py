"""The peers file (C-MOVE destinations): JSON or TOML; malformed entries refused."""

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


@pytest.mark.parametrize("text", ['{"A": {"host": "h"}}', '{"A": {"host": "h", "port": 0}}', "[1]", "{",
                                  '{"WAYTOOLONGAETITLE17": {"host": "h", "port": 104}}'])
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
