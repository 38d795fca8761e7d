"""The listener's reactors block on the socket and on events, never poll with sleeps
(issue 10: "no polling sleeps on the receive path"; dicomweb_server/dimse/reactor.py)."""

from __future__ import annotations

import threading
import time

from pynetdicom import AE, build_context
from pynetdicom.sop_class import CTImageStorage
from pydicom import uid as U

from dicomweb_server.archive import Archive
from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.scp import DimseServer
from dicomweb_server.settings import Settings
from tests.helpers import make_dataset


def test_association_threads_never_sleep(tmp_path, monkeypatch):
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="memory"))
    server = DimseServer(archive)
    port = server.start(host="127.0.0.1", port=0)
    sleeps: list[str] = []
    real_sleep = time.sleep
    main = threading.main_thread()

    def counting_sleep(seconds):
        if threading.current_thread() is not main:  # the association and DUL threads
            sleeps.append(threading.current_thread().name)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", counting_sleep)
    try:
        ae = AE(ae_title="TESTSCU")
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
        ae.add_requested_context(CTImageStorage, U.ExplicitVRLittleEndian)
        ds = make_dataset(rows=16, columns=16, PatientID="NOSLEEP")
        for _ in range(2):
            assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
            assert assoc.is_established
            real_sleep(0.05)  # idle: a polling reactor would sleep here
            assert assoc.send_c_store(ds).Status == S.SUCCESS
            assoc.release()
            assert assoc.is_released
    finally:
        monkeypatch.setattr(time, "sleep", real_sleep)
        server.stop()
        archive.close()
    assert sleeps == []
