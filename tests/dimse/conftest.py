"""A live archive with its DIMSE listener on free ports (the listener runs inside the
worker, sharing the archive, as with --index memory), and pynetdicom as the SCU."""

from __future__ import annotations

import contextlib
import faulthandler
from dataclasses import dataclass

import httpx
import pydicom
import pytest
from pynetdicom import AE, build_context
from pynetdicom.sop_class import Verification

from tests.helpers import LiveServer, free_port

AET = "DICOMWEB"


@dataclass
class Dimse:
    server: LiveServer
    port: int
    http: httpx.Client

    def associate(self, contexts=None, ae_title="TESTSCU", **kwargs):
        ae = AE(ae_title=ae_title)
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
        for cx in contexts or [build_context(Verification)]:
            ae.add_requested_context(cx.abstract_syntax, cx.transfer_syntax)
        assoc = ae.associate("127.0.0.1", self.port, ae_title=AET, **kwargs)
        assert assoc.is_established, "association rejected"
        return assoc

    def store(self, datasets, ae_title="TESTSCU") -> list[int]:
        """C-STORE each data set (or file path) on one association; the statuses."""
        classes = {}
        for ds in datasets:
            d = pydicom.dcmread(ds, stop_before_pixels=True) if not isinstance(ds, pydicom.Dataset) else ds
            classes.setdefault(str(d.SOPClassUID), set()).add(str(d.file_meta.TransferSyntaxUID))
        contexts = [build_context(c, sorted(ts)) for c, ts in classes.items()]
        assoc = self.associate(contexts[:128], ae_title=ae_title)
        try:
            return [int(assoc.send_c_store(ds).Status) for ds in datasets]
        finally:
            assoc.release()


@pytest.fixture
def dimse(tmp_path, request, index_kind):
    """``index_kind`` (tests/conftest.py): sqlite and memory; ``sqlite+s3`` (instances in
    a local S3 server) in the modules that say ``S3 = True``."""
    port = free_port()
    index, _, storage = index_kind.partition("+")
    extra = request.getfixturevalue("s3_storage") if storage else {}
    srv = LiveServer(tmp_path / "data", index, dimse_port=port, dimse_in_worker=True,
                     dimse_peers_file=None, **extra).start()
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield Dimse(srv, port, client)
    srv.stop()


@contextlib.contextmanager
def archive_moving_to(tmp_path, dest_port: int, ae_title: str = "MOVEDEST"):
    """A live archive (sqlite) whose peers file names one C-MOVE destination, ``ae_title``
    on ``dest_port``."""
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[{ae_title}]\nhost = "127.0.0.1"\nport = {dest_port}\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True,
                     dimse_peers_file=peers).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            yield Dimse(srv, port, client)
    finally:
        srv.stop()


@pytest.fixture
def stacks_if_stuck():
    """Every thread's stack on stderr (shown with a failure) when the test still runs after
    20 s: a C-STORE-RSP that once did not arrive within the SCU's 30 s DIMSE timeout, in a CI
    run under load (test_bad_input.py, test_command_mismatch.py), could not be reproduced in
    ~80 runs here; the next one says where each thread was."""
    faulthandler.dump_traceback_later(20, exit=False)
    yield
    faulthandler.cancel_dump_traceback_later()
