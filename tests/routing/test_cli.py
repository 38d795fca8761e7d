"""``dicomweb-server queue`` and ``dicomweb-server export`` (no server running: the
rows wait in the outbox for the next forwarder)."""

from __future__ import annotations

import orjson
import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.cli import main
from dicomweb_server.routing.outbox import Settlement
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset, store_datasets
from tests.routing.conftest import ALL


@pytest.mark.parametrize("backend", ALL, indirect=True)
def test_queue_and_retry_failed(tmp_path, capsys, backend):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n'
                      '[[rules]]\ndestinations = ["pacs"]\n')
    data = tmp_path / "data"
    archive = Archive.open(Settings(data_dir=data, index=backend.index, routes_file=routes, **backend.settings))
    store_datasets(archive, [make_dataset() for _ in range(3)])
    outbox = archive.routing.outbox
    rows, _ = outbox.claim("pacs", 1, "test:1:x:0", 60, 2)
    outbox.settle(Settlement([], [], [(rows[0].id, "HTTP 404")], []), "test:1:x:0")
    archive.close()
    assert main(["queue", "--data-dir", str(data), *backend.args, "--json"]) == 0
    stats = orjson.loads(capsys.readouterr().out)["destinations"]["pacs"]
    assert (stats["pending"], stats["in_flight"], stats["delivered"], stats["failed"], stats["last_error"]) == (
        2, 0, 0, 1, "HTTP 404")
    assert main(["queue", "--data-dir", str(data), *backend.args, "--retry-failed"]) == 0
    out = capsys.readouterr()
    assert "1 failed forward(s) back to pending" in out.err
    header, line = out.out.splitlines()
    assert header.split() == ["destination", "pending", "in_flight", "delivered", "failed", "oldest_pending_age",
                              "last_error"]
    assert line.split()[:5] == ["pacs", "3", "0", "0", "0"]


def test_export_a_series(tmp_path, capsys, backend):
    routes = tmp_path / "routes.toml"
    routes.write_text('[[destinations]]\nname = "pacs"\nstow_url = "http://127.0.0.1:9/x"\n')  # no rules
    data = tmp_path / "data"
    archive = Archive.open(Settings(data_dir=data, index=backend.index, **backend.settings))
    store_datasets(archive, [make_dataset(study="1.2.3", series="1.2.3.1") for _ in range(2)] + [make_dataset(study="1.2.3")])
    archive.close()
    args = ["export", "--data-dir", str(data), *backend.args, "--routes", str(routes), "--to", "pacs"]
    assert main(args + ["1.2.3", "1.2.3.1"]) == 0
    assert capsys.readouterr().out.startswith("2 instance(s) queued for pacs (of 2")
    assert main(args + ["1.2.3"]) == 0  # the two already pending are not owed twice
    assert capsys.readouterr().out.startswith("1 instance(s) queued for pacs (of 3")
    assert main(["export", "--data-dir", str(data), *backend.args, "--routes", str(routes), "--to", "elsewhere",
                 "1.2.3"]) == 2
    assert main(args + ["1.2.9"]) == 1
