"""After a study $update (lifecycle/update.py) C-FIND answers the new patient and C-GET
delivers the new files; a C-STORE of other content under a stored SOP Instance UID follows
duplicate_policy (0x0111 with reject, a new version with replace)."""

from __future__ import annotations

import httpx
import pytest
from pydicom.uid import generate_uid
from pynetdicom.sop_class import PatientRootQueryRetrieveInformationModelFind

from dicomweb_server.dimse import status as S
from tests.helpers import LiveServer, free_port, make_dataset

from .conftest import Dimse
from .test_query_retrieve import _c_get, _find, _ident

S3 = True


def test_find_and_get_after_an_update(dimse):
    st, se = generate_uid(), generate_uid()
    dss = [make_dataset(study=st, series=se, PatientID="OLD", PatientName="Old^Name", InstanceNumber=i)
           for i in (1, 2)]
    assert dimse.store(dss) == [S.SUCCESS] * 2
    r = dimse.http.post(f"/studies/{st}/$update", json={"00100010": {"vr": "PN", "Value": [{"Alphabetic": "New^Name"}]},
                                                        "00100020": {"vr": "LO", "Value": ["NEW"]}})
    assert r.status_code == 200, r.text
    found = _find(dimse, PatientRootQueryRetrieveInformationModelFind,
                  {"QueryRetrieveLevel": "STUDY", "PatientID": "NEW", "StudyInstanceUID": "", "PatientName": ""})
    assert [(d.StudyInstanceUID, str(d.PatientName)) for d in found] == [(st, "New^Name")]
    assert _find(dimse, PatientRootQueryRetrieveInformationModelFind,
                 {"QueryRetrieveLevel": "STUDY", "PatientID": "OLD", "StudyInstanceUID": ""}) == []
    responses, received = _c_get(dimse, dss, _ident("STUDY", StudyInstanceUID=st))
    assert responses[-1][0].Status == S.SUCCESS
    assert sorted((d.SOPInstanceUID, d.PatientID, str(d.PatientName)) for d in received) == sorted(
        (d.SOPInstanceUID, "NEW", "New^Name") for d in dss)
    assert all(d.PixelData == dss[0].PixelData for d in received)


@pytest.mark.parametrize("policy, status", [("reject", 0x0111), ("replace", S.SUCCESS), ("keep", S.SUCCESS)])
def test_c_store_duplicate_policy(tmp_path, policy, status):
    port = free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=None,
                     duplicate_policy=policy).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            d = Dimse(srv, port, client)
            st, se = generate_uid(), generate_uid()
            first = make_dataset(study=st, series=se, PatientID="P", StudyDescription="first")
            assert d.store([first]) == [S.SUCCESS]
            again = make_dataset(study=st, series=se, sop=first.SOPInstanceUID, PatientID="P",
                                 StudyDescription="second")
            assert d.store([again]) == [status]
            (meta,) = client.get(f"/studies/{st}/metadata").json()
            assert meta["00081030"]["Value"] == ["second" if policy == "replace" else "first"]
    finally:
        srv.stop()
