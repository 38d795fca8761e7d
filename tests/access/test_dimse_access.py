"""Access rules over DIMSE, on every index (memory, SQLite, PostgreSQL): a calling AE
title allowed label ``a`` and not ``b`` finds, gets and moves nothing of study B (it
answers as a study that does not exist), and a C-STORE into B is refused with 0x0124
(PS3.7 Annex C, Refused: Not Authorized); a new study it stores gets its write label. The
counts of a C-FIND answer (patient, study, series related) are those of the allowed studies."""

from __future__ import annotations

import httpx
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.sop_class import (
    PatientRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelFind,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
)

from dicomweb_server.dimse import status as S
from tests.dimse.conftest import Dimse
from tests.dimse.test_query_retrieve import store_scp  # noqa: F401 - the Storage SCP fixture (AE MOVEDEST)
from tests.helpers import LiveServer, free_port, make_dataset


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def dimse(request, tmp_path, store_scp):  # noqa: F811
    extra = {"database_url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    peers = tmp_path / "peers.toml"
    peers.write_text(f'[MOVEDEST]\nhost = "127.0.0.1"\nport = {store_scp[0]}\n')
    port = free_port()
    srv = LiveServer(tmp_path / "data", request.param, dimse_port=port, dimse_in_worker=True,
                     dimse_peers_file=peers, **extra,
                     access_rules={"identities": {"ae:SCU_A": ["a"], "ae:SCU_B": ["b"]}}).start()
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield Dimse(srv, port, client)
    srv.stop()


@pytest.fixture
def two(dimse):
    """Study A stored by SCU_A (so labelled a), study B (2 instances) by SCU_B (labelled b)."""
    sa, sb, seb = generate_uid(), generate_uid(), generate_uid()
    a = [make_dataset(study=sa, PatientID="PA", PatientName="A^A")]
    b = [make_dataset(study=sb, series=seb, PatientID="PB", PatientName="B^B", InstanceNumber=i) for i in (1, 2)]
    assert dimse.store(a, ae_title="SCU_A") == [S.SUCCESS]
    assert dimse.store(b, ae_title="SCU_B") == [S.SUCCESS, S.SUCCESS]
    assert dimse.http.get(f"/studies/{sa}/labels").json() == ["a"]
    assert dimse.http.get(f"/studies/{sb}/labels").json() == ["b"]
    return a, b


def find(dimse, ae_title, model, **keys) -> list[Dataset]:
    ident = Dataset()
    for k, v in keys.items():
        setattr(ident, k, v)
    assoc = dimse.associate([build_context(model)], ae_title=ae_title)
    try:
        out = []
        for status, answer in assoc.send_c_find(ident, model):
            if status.Status == S.PENDING:
                out.append(answer)
            else:
                assert status.Status == S.SUCCESS, hex(status.Status)
        return out
    finally:
        assoc.release()


def study_ident(study: str) -> Dataset:
    ident = Dataset()
    ident.QueryRetrieveLevel = "STUDY"
    ident.StudyInstanceUID = study
    return ident


def c_get(dimse, ae_title, study) -> tuple[tuple, list[str]]:
    received: list[str] = []

    def on_store(event):
        received.append(event.dataset.SOPInstanceUID)
        return 0x0000

    ae = AE(ae_title=ae_title)
    ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
    ae.add_requested_context("1.2.840.10008.5.1.4.1.1.2")  # CT Image Storage (make_dataset's)
    assoc = ae.associate("127.0.0.1", dimse.port, ae_title="DICOMWEB",
                         ext_neg=[build_role("1.2.840.10008.5.1.4.1.1.2", scp_role=True)],
                         evt_handlers=[(evt.EVT_C_STORE, on_store)])
    assert assoc.is_established
    final = list(assoc.send_c_get(study_ident(study), StudyRootQueryRetrieveInformationModelGet))[-1][0]
    assoc.release()
    return (final.Status, final.get("NumberOfCompletedSuboperations"), final.get("NumberOfFailedSuboperations")), \
        received


def c_move(dimse, ae_title, study) -> tuple:
    assoc = dimse.associate([build_context(StudyRootQueryRetrieveInformationModelMove)], ae_title=ae_title)
    final = list(assoc.send_c_move(study_ident(study), "MOVEDEST", StudyRootQueryRetrieveInformationModelMove))[-1][0]
    assoc.release()
    return final.Status, final.get("NumberOfCompletedSuboperations"), final.get("NumberOfFailedSuboperations")


def test_find_get_move_see_only_the_allowed_studies(dimse, two, store_scp):  # noqa: F811
    a, b = two
    sa, sb = a[0].StudyInstanceUID, b[0].StudyInstanceUID
    study_root = StudyRootQueryRetrieveInformationModelFind
    assert {d.StudyInstanceUID for d in find(dimse, "SCU_A", study_root, QueryRetrieveLevel="STUDY",
                                              StudyInstanceUID="")} == {sa}
    assert {d.StudyInstanceUID for d in find(dimse, "OTHER", study_root, QueryRetrieveLevel="STUDY",
                                              StudyInstanceUID="")} == {sa, sb}  # no rule: everything
    assert [d.PatientID for d in find(dimse, "SCU_A", PatientRootQueryRetrieveInformationModelFind,
                                      QueryRetrieveLevel="PATIENT", PatientID="")] == ["PA"]
    seb = b[0].SeriesInstanceUID  # a hierarchical query: one value per level above (PS3.4 C.4.1.2.1)
    assert find(dimse, "SCU_A", study_root, QueryRetrieveLevel="IMAGE", StudyInstanceUID=sb,
                SeriesInstanceUID=seb, SOPInstanceUID="") == []
    assert len(find(dimse, "SCU_B", study_root, QueryRetrieveLevel="IMAGE", StudyInstanceUID=sb,
                    SeriesInstanceUID=seb, SOPInstanceUID="")) == 2
    # C-GET and C-MOVE of B by A: the answer to a study that does not exist
    ghost = generate_uid()
    assert c_get(dimse, "SCU_A", sb) == c_get(dimse, "SCU_A", ghost)
    assert c_get(dimse, "SCU_A", sb)[1] == []
    assert c_get(dimse, "SCU_B", sb)[0][:2] == (S.SUCCESS, 2)
    assert c_move(dimse, "SCU_A", sb) == c_move(dimse, "SCU_A", ghost)
    assert store_scp[1] == []
    assert c_move(dimse, "SCU_B", sb)[:2] == (S.SUCCESS, 2)
    assert sorted(d.SOPInstanceUID for d in store_scp[1]) == sorted(d.SOPInstanceUID for d in b)


def test_c_store_into_a_study_not_allowed_is_refused(dimse, two):
    a, b = two
    sb = b[0].StudyInstanceUID
    assert dimse.store([make_dataset(study=sb, PatientID="PB", PatientName="B^B")], ae_title="SCU_A") == \
        [S.NOT_AUTHORIZED]
    assert len(dimse.http.get(f"/studies/{sb}/instances").json()) == 2  # nothing merged
    assert dimse.store([make_dataset(study=a[0].StudyInstanceUID, PatientID="PA", PatientName="A^A")],
                       ae_title="SCU_A") == [S.SUCCESS]
    assert dimse.http.get(f"/studies/{a[0].StudyInstanceUID}/labels").json() == ["a"]


COUNTS = {"NumberOfPatientRelatedStudies": "", "NumberOfPatientRelatedSeries": "",
          "NumberOfPatientRelatedInstances": ""}


@pytest.fixture
def split_patient(dimse):
    """Patient PX with study 1 (stored by SCU_A, so labelled a: 2 series of 2 + 1 instances)
    and study 2 (stored by SCU_B, labelled b: 1 series of 4 instances); patient PY with one
    study, labelled b (1 instance)."""
    s1, s2, s3 = generate_uid(), generate_uid(), generate_uid()
    se1a, se1b, se2 = generate_uid(), generate_uid(), generate_uid()
    one = [make_dataset(study=s1, series=se1a, PatientID="PX", PatientName="X^X", InstanceNumber=i) for i in (1, 2)]
    one.append(make_dataset(study=s1, series=se1b, PatientID="PX", PatientName="X^X", InstanceNumber=3))
    two = [make_dataset(study=s2, series=se2, PatientID="PX", PatientName="X^X", InstanceNumber=i)
           for i in (1, 2, 3, 4)]
    only_b = [make_dataset(study=s3, PatientID="PY", PatientName="Y^Y")]
    assert dimse.store(one, ae_title="SCU_A") == [S.SUCCESS] * 3
    assert dimse.store(two + only_b, ae_title="SCU_B") == [S.SUCCESS] * 5
    assert [dimse.http.get(f"/studies/{s}/labels").json() for s in (s1, s2, s3)] == [["a"], ["b"], ["b"]]
    return {"s1": s1, "s2": s2, "s3": s3, "se1a": se1a, "se1b": se1b, "se2": se2}


def patient_counts(dimse, ae_title, patient_id="") -> list[tuple]:
    answers = find(dimse, ae_title, PatientRootQueryRetrieveInformationModelFind, QueryRetrieveLevel="PATIENT",
                   PatientID=patient_id, **COUNTS)
    return sorted((d.PatientID, d.NumberOfPatientRelatedStudies, d.NumberOfPatientRelatedSeries,
                   d.NumberOfPatientRelatedInstances) for d in answers)


def test_patient_counts_count_only_the_allowed_studies(dimse, split_patient):
    """Number of Patient Related Studies, Series, Instances (0020,1200/1202/1204; PS3.4 Table
    C.6-1, C.3.4) are counted over the studies the calling AE may see: SCU_A (label a) does
    not learn through them that PX has a study labelled b, nor that PY exists."""
    assert patient_counts(dimse, "SCU_A") == [("PX", 1, 2, 3)]  # study 1 alone
    assert patient_counts(dimse, "SCU_B") == [("PX", 1, 1, 4), ("PY", 1, 1, 1)]
    assert patient_counts(dimse, "OTHER") == [("PX", 2, 3, 7), ("PY", 1, 1, 1)]  # no rule: both studies
    # asked by its Patient ID, PY (only a b study) is a patient that does not exist to SCU_A
    assert patient_counts(dimse, "SCU_A", "PY") == [] == patient_counts(dimse, "SCU_A", "NOBODY")
    assert patient_counts(dimse, "SCU_A", "PX") == [("PX", 1, 2, 3)]


def test_study_and_series_counts_of_the_allowed_studies_only(dimse, split_patient):
    """NumberOfStudyRelatedSeries/Instances (0020,1206/1208) and NumberOfSeriesRelatedInstances
    (0020,1209): SCU_A sees study 1 only, with its own counts; study 2's series are not there."""
    u = split_patient

    def studies(ae_title, model):
        return sorted((d.StudyInstanceUID, d.NumberOfStudyRelatedSeries, d.NumberOfStudyRelatedInstances)
                      for d in find(dimse, ae_title, model, QueryRetrieveLevel="STUDY", PatientID="PX",
                                    StudyInstanceUID="", NumberOfStudyRelatedSeries="",
                                    NumberOfStudyRelatedInstances=""))
    for model in (StudyRootQueryRetrieveInformationModelFind, PatientRootQueryRetrieveInformationModelFind):
        assert studies("SCU_A", model) == [(u["s1"], 2, 3)]
        assert studies("OTHER", model) == sorted([(u["s1"], 2, 3), (u["s2"], 1, 4)])

    def series(ae_title, **keys):
        return sorted((d.SeriesInstanceUID, d.NumberOfSeriesRelatedInstances)
                      for d in find(dimse, ae_title, StudyRootQueryRetrieveInformationModelFind,
                                    QueryRetrieveLevel="SERIES", SeriesInstanceUID="",
                                    NumberOfSeriesRelatedInstances="", **keys))
    # a relational SERIES query by Patient ID (PS3.4 C.4.1.2.2): study 1's two series only
    assert series("SCU_A", PatientID="PX") == sorted([(u["se1a"], 2), (u["se1b"], 1)])
    assert series("OTHER", PatientID="PX") == sorted([(u["se1a"], 2), (u["se1b"], 1), (u["se2"], 4)])
    assert series("SCU_A", StudyInstanceUID=u["s2"]) == []
    assert series("SCU_B", StudyInstanceUID=u["s2"]) == [(u["se2"], 4)]
