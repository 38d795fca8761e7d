"""benchmarks/worker_spread.py counts established connections per owning process
(``ss -tnp``): three connections accepted by this process are three of this pid's."""

from __future__ import annotations

import importlib.util
import pathlib
import socket

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "worker_spread.py"


def _module():
    spec = importlib.util.spec_from_file_location("worker_spread", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spread_counts_connections_per_process():
    spread = _module().spread
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        assert spread(port) == []
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [listener.accept()[0] for _ in clients]
        try:
            # both ends belong to this process: only the accepted ends have the source port
            assert spread(port) == [3]
        finally:
            for s in clients + accepted:
                s.close()
