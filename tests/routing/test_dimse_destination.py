"""A DIMSE destination: C-STORE with pynetdicom's SCU to a Storage SCP (PS3.4
Annex B); a failure status other than out of resources dead-letters that instance."""

from __future__ import annotations

import io

import httpx
import pydicom
from pynetdicom import AE, AllStoragePresentationContexts, evt

from tests.helpers import LiveServer, free_port, make_dataset, to_bytes
from tests.routing.conftest import FAST, wait_for
from tests.routing.test_delivery import queue, store


def storage_scp(tmp_path, on_store):
    """A Storage SCP "PACS" calling ``on_store`` for each C-STORE, and a routes file
    sending every instance to it. Returns (the running server, the routes file)."""
    scp = AE(ae_title="PACS")
    scp.supported_contexts = AllStoragePresentationContexts
    port = free_port()
    server = scp.start_server(("127.0.0.1", port), block=False, evt_handlers=[(evt.EVT_C_STORE, on_store)])
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[destinations]]\nname = "pacs"\ndimse = {{ ae_title = "PACS", host = "127.0.0.1", '
                      f'port = {port} }}\n[[rules]]\ndestinations = ["pacs"]\n{FAST}')
    return server, routes


def test_c_store_destination(tmp_path, backend):
    received: dict[str, bytes] = {}
    refuse: set[str] = set()

    def on_store(event):
        ds = event.dataset
        if ds.SOPInstanceUID in refuse:
            return 0xC000  # cannot understand (PS3.4 B.2.3)
        ds.file_meta = event.file_meta
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        received[ds.SOPInstanceUID] = buf.getvalue()
        return 0x0000

    server, routes = storage_scp(tmp_path, on_store)
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings).start()
    try:
        datasets = [make_dataset() for _ in range(3)]
        refuse.add(datasets[0].SOPInstanceUID)
        store(srv.url, datasets)
        wait_for(lambda: queue(srv.url)["pacs"]["delivered"] == 2 and queue(srv.url)["pacs"]["failed"] == 1,
                 what="2 delivered, 1 failed")
        assert queue(srv.url)["pacs"]["last_error"] == "C-STORE status 0xC000"
        assert set(received) == {ds.SOPInstanceUID for ds in datasets[1:]}
        for ds in datasets[1:]:  # the same data set, element for element
            got = pydicom.dcmread(io.BytesIO(received[ds.SOPInstanceUID]))
            assert got == pydicom.dcmread(io.BytesIO(to_bytes(ds)))
            assert got.file_meta.TransferSyntaxUID == ds.file_meta.TransferSyntaxUID
        assert httpx.get(srv.url + "/admin/queue").status_code == 200
    finally:
        srv.stop()
        server.shutdown()


def test_a_c_store_warning_0001_is_delivered(tmp_path):
    """PS3.4 B.2.3: a Warning status (0001, Bxxx) means stored (0001 was dead-lettered)."""
    received: list[str] = []

    def on_store(event):
        received.append(event.dataset.SOPInstanceUID)
        return 0x0001

    server, routes = storage_scp(tmp_path, on_store)
    srv = LiveServer(tmp_path / "data", "sqlite", routes_file=routes).start()
    try:
        ds = make_dataset()
        store(srv.url, [ds])
        q = wait_for(lambda: (lambda d: d if d["delivered"] == 1 else None)(queue(srv.url)["pacs"]),
                     what="delivered")
        assert (q["failed"], q["pending"], received) == (0, 0, [ds.SOPInstanceUID])
    finally:
        srv.stop()
        server.shutdown()
