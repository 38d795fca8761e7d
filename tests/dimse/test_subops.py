"""Retrieve sub-operations (issue 31; PS3.4 C.4.2, C.4.3; PS3.7 9.1.1.1, 9.1.3, 9.1.4): a
C-MOVE or C-GET whose instances include some the destination will not take delivers every
other instance, counts each refusal as failed, names it in the Failed SOP Instance UID List
(0008,0058) of exactly one final response (0xB000 some failed, 0xA702 all failed), and the
requester's association goes on. Each C-MOVE sub-operation names the C-MOVE's requester
and Message ID (Move Originator AE Title / Message ID). A request on a presentation context
of another SOP class is refused with 0x0122 (PS3.7 Annex C), not served."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time

import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.sop_class import (
    CTImageStorage,
    MRImageStorage,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)

from dicomweb_server.dimse import status as S
from tests.helpers import free_port, make_dataset

from .conftest import archive_moving_to

STUDY = "1.2.826.0.1.3680043.8.498.31"
MR = str(MRImageStorage)


class Destination:
    """A Storage SCP (AE MOVEDEST) that accepts CT Image Storage (and Verification) only,
    answers ``refuse[uid]`` to the instances named there, and keeps each C-STORE-RQ."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, int | None]] = []  # (SOP Instance UID, originator AE, originator id)
        self.refuse: dict[str, int] = {}
        ae = AE(ae_title="MOVEDEST")
        ae.add_supported_context(CTImageStorage)
        ae.add_supported_context(Verification)
        self.port = free_port()
        self.server = ae.start_server(("127.0.0.1", self.port), block=False,
                                      evt_handlers=[(evt.EVT_C_STORE, self._on_store)])

    def _on_store(self, event):
        rq = event.request
        uid = str(rq.AffectedSOPInstanceUID)
        aet = rq.MoveOriginatorApplicationEntityTitle
        self.received.append((uid, aet.strip() if isinstance(aet, str) else aet, rq.MoveOriginatorMessageID))
        return self.refuse.get(uid, 0x0000)

    def uids(self) -> list[str]:
        return [u for u, _, _ in self.received if u not in self.refuse]


@pytest.fixture
def dest():
    d = Destination()
    yield d
    d.server.shutdown()


@pytest.fixture
def archive(tmp_path, dest):
    with archive_moving_to(tmp_path, dest.port) as d:
        yield d


@pytest.fixture
def study(archive):
    """Two CT instances and one MR instance in one study."""
    dss = [make_dataset(study=STUDY, series=STUDY + ".1", InstanceNumber=i) for i in (1, 2)]
    dss.append(make_dataset(study=STUDY, series=STUDY + ".2", modality="MR", sop_class=MR))
    assert archive.store(dss) == [S.SUCCESS] * 3
    return dss


def _ident(**uids) -> Dataset:
    ds = Dataset()
    ds.QueryRetrieveLevel = "STUDY" if "SeriesInstanceUID" not in uids else "SERIES"
    for k, v in uids.items():
        setattr(ds, k, v)
    return ds


def _move(archive, identifier, msg_id=7):
    """A C-MOVE to MOVEDEST by TESTSCU: the responses, and whether the association was still
    established after (a C-ECHO on it answered Success)."""
    assoc = archive.associate([build_context(StudyRootQueryRetrieveInformationModelMove), build_context(Verification)])
    try:
        responses = list(assoc.send_c_move(identifier, "MOVEDEST", StudyRootQueryRetrieveInformationModelMove,
                                           msg_id=msg_id))
        alive = assoc.is_established and assoc.send_c_echo().Status == S.SUCCESS
    finally:
        assoc.release()
    return responses, alive


def _one_final(responses):
    """The final response and its identifier; all before it Pending (0xFF00)."""
    assert responses, "no response"
    assert [int(r.Status) for r, _ in responses[:-1]] == [S.PENDING] * (len(responses) - 1)
    final, identifier = responses[-1]
    assert int(final.Status) != S.PENDING
    return final, identifier


def _counts(final) -> tuple[int, int, int]:
    return (final.NumberOfCompletedSuboperations, final.NumberOfFailedSuboperations,
            final.NumberOfWarningSuboperations)


def _failed(identifier) -> list[str]:
    v = identifier.get("FailedSOPInstanceUIDList") if identifier is not None else None
    if not v:
        return []
    return sorted([v] if isinstance(v, str) else list(v))


def test_move_with_a_sop_class_the_destination_does_not_accept(archive, dest, study):
    """The MR has no accepted presentation context at MOVEDEST: the two CTs arrive, the MR
    is one failed sub-operation named in (0008,0058), one final 0xB000, the association goes on."""
    responses, alive = _move(archive, _ident(StudyInstanceUID=STUDY))
    final, identifier = _one_final(responses)
    assert int(final.Status) == S.QR_SUBOPS_WARNING
    assert _counts(final) == (2, 1, 0)
    assert _failed(identifier) == [study[2].SOPInstanceUID]
    assert sorted(dest.uids()) == sorted(d.SOPInstanceUID for d in study[:2])
    assert alive


def test_move_refused_by_the_destination(archive, dest, study):
    """MOVEDEST answers 0xA700 (Out of Resources) to one CT: that one failed and listed (with
    the MR it cannot accept), the other CT completed."""
    dest.refuse[study[0].SOPInstanceUID] = 0xA700
    responses, alive = _move(archive, _ident(StudyInstanceUID=STUDY))
    final, identifier = _one_final(responses)
    assert int(final.Status) == S.QR_SUBOPS_WARNING
    assert _counts(final) == (1, 2, 0)
    assert _failed(identifier) == sorted([study[0].SOPInstanceUID, study[2].SOPInstanceUID])
    assert dest.uids() == [study[1].SOPInstanceUID]
    assert alive


def test_move_of_which_every_sub_operation_fails(archive, dest, study):
    """Only the MR series: no sub-operation can be performed, 0xA702 (PS3.4 C.4.2.1.5), the
    MR listed; still one final response and the association goes on."""
    responses, alive = _move(archive, _ident(StudyInstanceUID=STUDY, SeriesInstanceUID=STUDY + ".2"))
    final, identifier = _one_final(responses)
    assert int(final.Status) == S.QR_OUT_OF_RESOURCES_SUBOPS
    assert _counts(final) == (0, 1, 0)
    assert _failed(identifier) == [study[2].SOPInstanceUID]
    assert dest.received == []
    assert alive


def test_move_warning_from_the_destination_is_a_warning(archive, dest, study):
    """A C-STORE-RSP warning (0xB000 Coercion of Data Elements, PS3.4 B.2.3) counts as a
    warning sub-operation, not a failure: not in the Failed SOP Instance UID List."""
    dest.refuse[study[0].SOPInstanceUID] = 0xB000
    responses, _ = _move(archive, _ident(StudyInstanceUID=STUDY, SeriesInstanceUID=STUDY + ".1"))
    final, identifier = _one_final(responses)
    assert int(final.Status) == S.QR_SUBOPS_WARNING
    assert _counts(final) == (1, 0, 1)
    assert _failed(identifier) == []


def test_move_originator_of_each_sub_operation(archive, dest, study):
    """PS3.7 9.1.1.1: the Move Originator Application Entity Title is the AE that invoked the
    C-MOVE (TESTSCU, the requester), not the archive; the Message ID is the C-MOVE-RQ's."""
    responses, _ = _move(archive, _ident(StudyInstanceUID=STUDY, SeriesInstanceUID=STUDY + ".1"), msg_id=4242)
    final, _ = _one_final(responses)
    assert int(final.Status) == S.SUCCESS
    assert sorted(dest.received) == sorted((d.SOPInstanceUID, "TESTSCU", 4242) for d in study[:2])


def test_get_without_a_context_for_one_sop_class(archive, study):
    """C-GET whose requester offers a Storage context (SCP role) for CT only: the CTs arrive
    on the same association, the MR is one failed sub-operation, listed; one final 0xB000."""
    received: list[tuple[str, object]] = []

    def on_store(event):
        received.append((str(event.request.AffectedSOPInstanceUID), event.request.MoveOriginatorApplicationEntityTitle))
        return 0x0000

    ae = AE(ae_title="GETSCU")
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
    ae.add_requested_context(CTImageStorage)
    ae.add_requested_context(Verification)
    assoc = ae.associate("127.0.0.1", archive.port, ae_title="DICOMWEB", ext_neg=[build_role(CTImageStorage,
                                                                                              scp_role=True)],
                         evt_handlers=[(evt.EVT_C_STORE, on_store)])
    assert assoc.is_established
    try:
        responses = list(assoc.send_c_get(_ident(StudyInstanceUID=STUDY), StudyRootQueryRetrieveInformationModelGet))
        alive = assoc.is_established and assoc.send_c_echo().Status == S.SUCCESS
    finally:
        assoc.release()
    final, identifier = _one_final(responses)
    assert int(final.Status) == S.QR_SUBOPS_WARNING
    assert _counts(final) == (2, 1, 0)
    assert _failed(identifier) == [study[2].SOPInstanceUID]
    # a C-GET's sub-operations carry no Move Originator (PS3.7 9.1.1.1: C-MOVE only)
    assert sorted(received) == sorted((d.SOPInstanceUID, None) for d in study[:2])
    assert alive


# --- presentation contexts honoured (PS3.7 Annex C 0x0122, PS3.8 7.1.1.13) ------------------


def _on_context_of(assoc, abstract_syntax):
    """Make pynetdicom's SCU send the next request on the accepted context of ``abstract_syntax``
    whatever the request's SOP class is (as a broken peer would)."""
    cx = next(c for c in assoc.accepted_contexts if c.abstract_syntax == abstract_syntax)
    assoc._get_valid_context = lambda *a, **k: cx


def test_c_echo_on_a_storage_context_is_refused(archive):
    assoc = archive.associate([build_context(CTImageStorage), build_context(Verification)])
    try:
        assert assoc.send_c_echo().Status == S.SUCCESS  # on its own context
        _on_context_of(assoc, CTImageStorage)
        rsp = assoc.send_c_echo()
        assert int(rsp.Status) == S.SOP_CLASS_NOT_SUPPORTED
        assert assoc.is_established
    finally:
        assoc.release()


def test_c_store_of_another_sop_class_than_its_context_is_refused(archive):
    mr = make_dataset(study=STUDY, series=STUDY + ".9", modality="MR", sop_class=MR, PatientID="CXMISMATCH")
    assoc = archive.associate([build_context(CTImageStorage, mr.file_meta.TransferSyntaxUID)])
    try:
        _on_context_of(assoc, CTImageStorage)
        rsp = assoc.send_c_store(mr)
        assert int(rsp.Status) == S.SOP_CLASS_NOT_SUPPORTED
        assert assoc.is_established
    finally:
        assoc.release()
    assert archive.http.get("/instances", params={"PatientID": "CXMISMATCH"}).json() == []


# --- DCMTK as the requester and as the destination ---------------------------------------------

# DCMTK's, not the pynetdicom apps of the same names a virtualenv may put first on PATH
STORESCP, MOVESCU = (shutil.which(n, path="/usr/bin") for n in ("storescp", "movescu"))
DCMTK = STORESCP and MOVESCU


@pytest.fixture
def dcmtk_dest(tmp_path):
    """DCMTK's storescp as MOVEDEST, accepting CT Image Storage only (a config file profile)."""
    if not DCMTK:
        pytest.skip("DCMTK not installed")
    cfg = tmp_path / "storescp.cfg"
    cfg.write_text(
        "[[TransferSyntaxes]]\n[Uncompressed]\nTransferSyntax1 = LocalEndianExplicit\n"
        "TransferSyntax2 = OppositeEndianExplicit\nTransferSyntax3 = LittleEndianImplicit\n"
        "[[PresentationContexts]]\n[CTOnly]\nPresentationContext1 = CTImageStorage\\Uncompressed\n"
        "PresentationContext2 = VerificationSOPClass\\Uncompressed\n"
        "[[Profiles]]\n[CT]\nPresentationContexts = CTOnly\n")
    out = tmp_path / "in"
    out.mkdir()
    port = free_port()
    proc = subprocess.Popen([STORESCP, "-aet", "MOVEDEST", "-xf", str(cfg), "CT", "-od", str(out), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:  # listening
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "storescp does not listen"
            time.sleep(0.05)
    yield port, out
    proc.kill()
    proc.wait()


@pytest.mark.skipif(not DCMTK, reason="DCMTK not installed")
def test_dcmtk_movescu_to_a_storescp_that_takes_ct_only(tmp_path, dcmtk_dest):
    port, out = dcmtk_dest
    with archive_moving_to(tmp_path, port) as archive:
        dss = [make_dataset(study=STUDY, series=STUDY + ".1"),
               make_dataset(study=STUDY, series=STUDY + ".2", modality="MR", sop_class=MR)]
        assert archive.store(dss) == [S.SUCCESS] * 2
        r = subprocess.run([MOVESCU, "-d", "-S", "-aet", "MOVESCU", "-aec", "DICOMWEB", "-aem", "MOVEDEST",
                            "-k", "QueryRetrieveLevel=STUDY", "-k", f"StudyInstanceUID={STUDY}",
                            "127.0.0.1", str(archive.port)], capture_output=True, text=True, timeout=60)
        text = r.stdout + r.stderr
        final = text[text.rindex("Remaining Suboperations"):]  # the final C-MOVE-RSP, as movescu -d dumps it
        assert re.search(r"Completed Suboperations\s+: 1\b", final), text
        assert re.search(r"Failed Suboperations\s+: 1\b", final), text
        assert "DIMSE Status                  : 0xb000" in final, text
        assert f"(0008,0058) UI [{dss[1].SOPInstanceUID}]" in final, text  # Failed SOP Instance UID List
        assert text.count("Received Final Move Response") == 1, text
        names = [p.name for p in out.iterdir()]
        assert len(names) == 1 and dss[0].SOPInstanceUID in names[0], names


#: a storage SOP class DCMTK's getscu does not propose (Tractography Results Storage)
NOT_PROPOSED_BY_GETSCU = "1.2.840.10008.5.1.4.1.1.66.6"


@pytest.mark.skipif(not shutil.which("getscu", path="/usr/bin"), reason="DCMTK not installed")
def test_dcmtk_getscu_without_a_context_for_one_sop_class(archive, tmp_path):
    """DCMTK's getscu offers Storage contexts (SCP role) for a fixed list of SOP classes: a
    C-GET of a study holding a CT and an instance of a class outside it sends the CT over
    the association, fails the other, and ends with one final 0xB000. (getscu 3.6.7 does not
    read the identifier of that final C-GET-RSP, the Failed SOP Instance UID List the
    pynetdicom test above checks: its A-RELEASE then meets that P-DATA and it aborts.)"""
    dss = [make_dataset(study=STUDY, series=STUDY + ".1"),
           make_dataset(study=STUDY, series=STUDY + ".3", modality="MR", sop_class=NOT_PROPOSED_BY_GETSCU,
                        pixels=False)]
    assert archive.store(dss) == [S.SUCCESS] * 2
    out = tmp_path / "got"
    out.mkdir()
    r = subprocess.run([shutil.which("getscu", path="/usr/bin"), "-d", "-S", "-aet", "GETSCU", "-aec", "DICOMWEB",
                        "-od", str(out), "-k", "QueryRetrieveLevel=STUDY", "-k", f"StudyInstanceUID={STUDY}",
                        "127.0.0.1", str(archive.port)], capture_output=True, text=True, timeout=60)
    text = r.stdout + r.stderr
    assert NOT_PROPOSED_BY_GETSCU not in text.split("Requesting Association")[1].split("Association Accepted")[0], \
        "getscu proposed it: pick another SOP class"
    assert text.count("DIMSE Status                  : 0xb000") == 1, text  # one final response
    final = text[text.rindex("Received C-GET Response"):]
    assert re.search(r"Completed Suboperations\s+: 1\b", final), text
    assert re.search(r"Failed Suboperations\s+: 1\b", final), text
    assert "DIMSE Status                  : 0xb000" in final, text
    names = [p.name for p in out.iterdir()]
    assert len(names) == 1 and dss[0].SOPInstanceUID in names[0], names
