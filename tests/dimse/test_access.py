"""DIMSE behind the same door as HTTP (dicomweb_server/dimse/access.py): with authentication
configured, only the peers of the peers file associate, each from its host's address, each
within its scopes; every other calling AE title gets an A-ASSOCIATE-RJ (PS3.8 Table 9-21:
calling AE title not recognized), a service without its scope 0x0124 "Refused: Not
Authorized" (PS3.7 Annex C), and each decision is in the audit log. Before, any program that
sent a calling AE title read and wrote every patient's data over DIMSE while HTTP asked for
credentials."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import ExplicitVRLittleEndian
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.sop_class import (
    CTImageStorage,
    StudyRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)

from dicomweb_server.dimse import status as S
from dicomweb_server.dimse.access import AccessPolicy, startup_warnings
from dicomweb_server.dimse.peers import Peer
from dicomweb_server.identity import Identity
from dicomweb_server.settings import Settings
from tests.helpers import LiveServer, free_port, make_dataset, spool_files

from .test_query_retrieve import _ident
from .test_query_retrieve import store_scp as move_scp  # noqa: F401 - a fixture: AE MOVEDEST

STUDY = "1.2.826.0.1.3680043.8.498.88"
KEY = "k-0123456789"
CONTEXTS = [build_context(Verification), build_context(CTImageStorage, ExplicitVRLittleEndian),
            build_context(StudyRootQueryRetrieveInformationModelFind),
            build_context(StudyRootQueryRetrieveInformationModelGet),
            build_context(StudyRootQueryRetrieveInformationModelMove)]


@pytest.fixture
def guarded(tmp_path, move_scp):
    """An archive with an API key (authentication configured), its peers file, an audit log."""
    peers = {
        "READER": {"host": "127.0.0.1", "scopes": ["read"]},
        "WRITER": {"host": "localhost", "scopes": ["write"]},  # a host name: resolved
        "NOSCOPE": {"host": "127.0.0.1"},
        "ELSEWHERE": {"host": "192.0.2.7", "scopes": ["read", "write"]},  # TEST-NET-1: never this test's address
        "MOVEDEST": {"host": "127.0.0.1", "port": move_scp[0]},
    }
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(peers))
    audit = tmp_path / "audit.jsonl"
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=path,
                     api_keys={KEY: ["read", "write"]}, audit_log=audit).start()
    audit_logger = logging.getLogger("dicomweb_server.audit")
    try:
        yield srv, port, audit
    finally:
        srv.stop()
        for h in list(audit_logger.handlers):  # configure_audit_file's handler: this test's file only
            if isinstance(h, logging.FileHandler) and h.baseFilename == str(audit.resolve()):
                audit_logger.removeHandler(h)
                h.close()
        audit_logger.propagate = True


def _associate(port: int, ae_title: str, **kwargs):
    ae = AE(ae_title=ae_title)
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    for cx in CONTEXTS:
        ae.add_requested_context(cx.abstract_syntax, cx.transfer_syntax)
    return ae.associate("127.0.0.1", port, ae_title="DICOMWEB", **kwargs)


def _records(audit) -> list[dict]:
    """The access decisions (the association events of scp.py are there too)."""
    records = map(json.loads, audit.read_text().splitlines())
    return [r for r in records if r.get("protocol") == "DIMSE" and "service" in r]


def _find(assoc) -> list[tuple[int, Dataset | None]]:
    ident = _ident("STUDY", StudyInstanceUID=STUDY)
    ident.PatientID = ""
    return [(s.Status, i) for s, i in assoc.send_c_find(ident, StudyRootQueryRetrieveInformationModelFind)]


@pytest.mark.parametrize("ae_title", ["STRANGER", "ELSEWHERE"])
def test_an_ae_title_not_allowed_from_here_is_rejected(guarded, ae_title):
    srv, port, audit = guarded
    assoc = _associate(port, ae_title)
    assert not assoc.is_established and assoc.is_rejected
    rj = assoc.acceptor.primitive
    assert (rj.result, rj.result_source, rj.diagnostic) == (0x01, 0x01, 0x03)  # calling AE title not recognized
    (record,) = [r for r in _records(audit) if r["action"] == "associate"]
    assert (record["calling_ae"], record["client"], record["outcome"], record["user"]) == (
        ae_title, "127.0.0.1", "rejected", None)
    assert record["reason"] == ({"STRANGER": "calling AE title 'STRANGER' is not in the peers file",
                                 "ELSEWHERE": "calling AE title 'ELSEWHERE' from 127.0.0.1, not from its host "
                                              "'192.0.2.7'"}[ae_title])


def test_each_service_needs_its_scope(guarded, move_scp):
    srv, port, audit = guarded
    ds = make_dataset(study=STUDY, series=STUDY + ".1", PatientID="SCOPED")
    # a peer without scopes: C-ECHO only; its C-STORE refused and its data set gone from the spool
    assoc = _associate(port, "NOSCOPE")
    assert assoc.is_established
    assert assoc.send_c_echo().Status == S.SUCCESS
    rsp = assoc.send_c_store(ds)
    assert (rsp.Status, rsp.ErrorComment) == (S.NOT_AUTHORIZED,
                                               "C-STORE needs the 'write' scope, which peer 'NOSCOPE' lacks")
    assert _find(assoc) == [(S.NOT_AUTHORIZED, None)]
    assoc.release()
    assert spool_files(srv.settings.data_dir) == []
    assert srv.archive.index.locate(ds.SOPInstanceUID) is None
    # write: C-STORE, no C-FIND / C-GET / C-MOVE
    assoc = _associate(port, "WRITER")
    assert assoc.send_c_store(ds).Status == S.SUCCESS
    assert _find(assoc) == [(S.NOT_AUTHORIZED, None)]
    get = list(assoc.send_c_get(_ident("STUDY", StudyInstanceUID=STUDY), StudyRootQueryRetrieveInformationModelGet))
    assert [(s.Status, s.get("NumberOfFailedSuboperations")) for s, _ in get] == [(S.NOT_AUTHORIZED, None)]
    move = list(assoc.send_c_move(_ident("STUDY", StudyInstanceUID=STUDY), "MOVEDEST",
                                  StudyRootQueryRetrieveInformationModelMove))
    assert [s.Status for s, _ in move] == [S.NOT_AUTHORIZED]
    assoc.release()
    assert move_scp[1] == []  # nothing moved
    # read: C-FIND, C-GET, C-MOVE; no C-STORE
    received: list[str] = []

    def on_store(event):
        received.append(str(event.request.AffectedSOPInstanceUID))
        return 0x0000

    assoc = _associate(port, "READER", ext_neg=[build_role(CTImageStorage, scu_role=True, scp_role=True)],
                       evt_handlers=[(evt.EVT_C_STORE, on_store)])
    assert assoc.send_c_store(make_dataset(study=STUDY, series=STUDY + ".1")).Status == S.NOT_AUTHORIZED
    found = _find(assoc)
    assert [(s, i.StudyInstanceUID, i.PatientID) for s, i in found[:-1]] == [(S.PENDING, STUDY, "SCOPED")]
    assert found[-1] == (S.SUCCESS, None)
    get = list(assoc.send_c_get(_ident("STUDY", StudyInstanceUID=STUDY), StudyRootQueryRetrieveInformationModelGet))
    assert (get[-1][0].Status, get[-1][0].NumberOfCompletedSuboperations) == (S.SUCCESS, 1)
    assert received == [ds.SOPInstanceUID]
    move = list(assoc.send_c_move(_ident("STUDY", StudyInstanceUID=STUDY), "MOVEDEST",
                                  StudyRootQueryRetrieveInformationModelMove))
    assert (move[-1][0].Status, move[-1][0].NumberOfCompletedSuboperations) == (S.SUCCESS, 1)
    assoc.release()
    assert [d.SOPInstanceUID for d in move_scp[1]] == [ds.SOPInstanceUID]
    assert srv.archive.index.count() == 1
    # HTTP still asks for its credentials
    assert httpx.get(srv.url + "/studies").status_code == 401

    records = [(r["calling_ae"], r["service"], r["outcome"]) for r in _records(audit) if r["action"] != "associate"]
    assert records == [
        ("NOSCOPE", "C-ECHO", "allowed"), ("NOSCOPE", "C-STORE", "refused"), ("NOSCOPE", "C-FIND", "refused"),
        ("WRITER", "C-STORE", "allowed"), ("WRITER", "C-FIND", "refused"), ("WRITER", "C-GET", "refused"),
        ("WRITER", "C-MOVE", "refused"),
        ("READER", "C-STORE", "refused"), ("READER", "C-FIND", "allowed"), ("READER", "C-GET", "allowed"),
        ("READER", "C-MOVE", "allowed"),
    ]
    by = {(r["calling_ae"], r["service"]): r for r in _records(audit) if r["action"] != "associate"}
    assert by["WRITER", "C-STORE"] | {"time": None} == {
        "time": None, "event": "request", "protocol": "DIMSE", "action": "store", "service": "C-STORE",
        "user": "WRITER", "auth": "dimse-peer", "client": "127.0.0.1", "calling_ae": "WRITER", "called_ae": "DICOMWEB",
        "sop_class": CTImageStorage, "sop_instance": ds.SOPInstanceUID, "outcome": "allowed"}
    assert {k: by["READER", "C-MOVE"][k] for k in ("action", "level", "study", "move_destination")} == {
        "action": "retrieve", "level": "STUDY", "study": STUDY, "move_destination": "MOVEDEST"}
    assert by["WRITER", "C-FIND"]["reason"] == "C-FIND needs the 'read' scope, which peer 'WRITER' lacks"
    associations = [(r["calling_ae"], r["outcome"]) for r in _records(audit) if r["action"] == "associate"]
    assert associations == [("NOSCOPE", "allowed"), ("WRITER", "allowed"), ("READER", "allowed")]


def test_without_authentication_every_ae_title_is_served(tmp_path):
    """No credentials configured for HTTP: DIMSE as before, peers file or not."""
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True).start()
    try:
        assoc = _associate(port, "ANYONE")
        assert assoc.is_established
        ds = make_dataset(study=STUDY, series=STUDY + ".1", PatientID="OPEN")
        assert assoc.send_c_store(ds).Status == S.SUCCESS
        assert [s for s, _ in _find(assoc)] == [S.PENDING, S.SUCCESS]
        assoc.release()
    finally:
        srv.stop()


def test_a_service_without_a_scope_is_refused():
    """The one check every request passes (access.py): a service no scope is defined for (a
    DIMSE-N service added later, say) is refused while authentication is configured."""
    peers = {"WS": Peer("WS", "127.0.0.1", None, frozenset({"read", "write"}))}
    policy = AccessPolicy(Settings(api_keys={KEY: ["read"]}), peers)
    identity, _ = policy.identify("WS", "::ffff:127.0.0.1")  # a dual-stack socket's IPv4 address
    assert identity == Identity("WS", frozenset({"read", "write"}), "dimse-peer")
    assert [policy.authorize(identity, s) for s in ("C-ECHO", "C-STORE", "C-FIND", "C-GET", "C-MOVE")] == [None] * 5
    assert policy.authorize(identity, "N-DELETE") == "N-DELETE is not a service peers are authorized for"
    # Storage Commitment's N-ACTION (commitment.py) and MPPS's N-CREATE and N-SET (mpps.py) need
    # the write scope, as a C-STORE
    assert [policy.authorize(identity, s) for s in ("N-ACTION", "N-CREATE", "N-SET")] == [None] * 3
    reader = Identity("WS", frozenset({"read"}), "dimse-peer")
    assert [policy.authorize(reader, s) for s in ("N-ACTION", "N-CREATE", "N-SET")] == [
        f"{s} needs the 'write' scope, which peer 'WS' lacks" for s in ("N-ACTION", "N-CREATE", "N-SET")]
    assert policy.authorize(None, "C-ECHO") == "no identity"
    open_policy = AccessPolicy(Settings(), {})
    anyone, _ = open_policy.identify("ANY", "10.1.2.3")
    assert anyone is not None and anyone.method == "anonymous"
    assert open_policy.authorize(anyone, "N-CREATE") is None


def test_start_up_warnings(tmp_path):
    auth = {"api_keys": {KEY: ["read"]}}
    assert startup_warnings(Settings(**auth), {}) == [
        "WARNING: DIMSE DICOMWEB at 127.0.0.1:11112 rejects every association: authentication is configured "
        "and no --dimse-peers-file names the AE titles allowed, with their host and scopes (AE titles are not "
        "credentials); or turn DIMSE off with --dimse-port 0"]
    destinations = {"PACS": Peer("PACS", "10.0.0.5", 104)}
    assert "serves only C-ECHO" in startup_warnings(Settings(**auth, dimse_peers_file=tmp_path / "p.json"),
                                                    destinations)[0]
    assert startup_warnings(Settings(**auth), {"CT": Peer("CT", "10.0.0.6", None, frozenset({"write"}))}) == []
    assert startup_warnings(Settings(**auth, dimse_port=0), {}) == []
    assert startup_warnings(Settings(), {}) == []  # loopback, no authentication: nothing to say
    assert "serves any AE title everything" in startup_warnings(Settings(host="0.0.0.0", insecure=True), {})[0]
