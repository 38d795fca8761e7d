"""A destination with ``deidentify`` (routes file): instances leave de-identified by the
PS3.15 Annex E profile (deid/), with the project's consistent UIDs and pseudonyms; a
burned-in image is dead-lettered with the reason. SQLite and PostgreSQL index."""

from __future__ import annotations

import io

import httpx
import pytest
from pydicom import dcmread
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from dicomweb_server.deid.apply import date_offset, shift_date
from dicomweb_server.deid.pseudonyms import Pseudonyms, generated_pseudonym
from dicomweb_server.deid.uids import new_uid
from dicomweb_server.routing import RoutesError, load_routes
from tests.helpers import LiveServer, make_dataset
from tests.routing.conftest import wait_for, write_routes
from tests.routing.test_delivery import at_sink, queue, store

DEID = 'deidentify = "basic"\ndeidentify_options = ["retain_modified_dates"]\nproject = "trial-a"\n'


def test_a_deidentifying_destination(tmp_path, sink, backend):
    routes = write_routes(tmp_path / "routes.toml", sink.url)
    text = routes.read_text().replace('stow_url = "', DEID + 'stow_url = "', 1)
    routes.write_text(text)
    a = make_dataset(PatientID="MRN7", PatientName="Doe^John", StudyDate="20240110", AccessionNumber="A1")
    b = make_dataset(study=a.StudyInstanceUID, PatientID="MRN7", PatientName="Doe^John", StudyDate="20240110")
    ref = Dataset()
    ref.ReferencedSOPClassUID, ref.ReferencedSOPInstanceUID = a.SOPClassUID, a.SOPInstanceUID
    b.SourceImageSequence = Sequence([ref])
    us = make_dataset(PatientID="MRN8", modality="US")
    srv = LiveServer(tmp_path / "data", backend.index, routes_file=routes, **backend.settings).start()
    try:
        store(srv.url, [a, b, us])
        wait_for(lambda: queue(srv.url)["sink"]["delivered"] == 2 and queue(srv.url)["sink"]["failed"] == 1,
                 what="2 delivered, 1 dead-lettered")
        assert queue(srv.url)["sink"]["last_error"] == (
            "refused by de-identification (PS3.15 E): Modality US commonly burns in text and "
            "BurnedInAnnotation (0028,0301) is not NO")
    finally:
        srv.stop()
    table = (Pseudonyms.postgresql(backend.database_url) if backend.database_url
             else Pseudonyms.sqlite(tmp_path / "data" / "index.sqlite"))
    secret = table.secret("trial-a")
    assert [m.patient_id for m in table.mapping("trial-a")] == ["MRN7"]
    table.close()
    assert at_sink(sink, a.SOPInstanceUID) is None  # nothing under the original UIDs
    got = {}
    for ds in (a, b):
        body = at_sink(sink, new_uid(secret, ds.SOPInstanceUID))
        assert body is not None
        got[ds.SOPInstanceUID] = dcmread(io.BytesIO(body))
    da, db = got[a.SOPInstanceUID], got[b.SOPInstanceUID]
    assert da.PatientID == da.PatientName == generated_pseudonym(secret, "MRN7")
    assert da.StudyDate == shift_date("20240110", date_offset(secret, "MRN7")) and da.AccessionNumber == ""
    assert da.StudyInstanceUID == db.StudyInstanceUID == new_uid(secret, a.StudyInstanceUID)
    assert db.SourceImageSequence[0].ReferencedSOPInstanceUID == da.SOPInstanceUID  # resolves at the sink
    assert da.PixelData == a.PixelData
    r = httpx.get(f"{sink.url}/studies", params={"PatientID": "MRN7"})
    assert r.status_code in (200, 204) and not (r.content and r.json())  # the sink never saw the MRN


@pytest.mark.parametrize("fields,message", [
    ('deidentify = "strict"', "unknown de-identification profile 'strict'"),
    ('deidentify = "basic"\ndeidentify_options = ["retain_all"]', "unknown de-identification option 'retain_all'"),
    ('project = "x"', "only with deidentify"),
    ('deidentify = "basic"\nallow_burned_in = "yes"', "true or false"),
    ('deidentify = "basic"\nsafe_private = ["ACME:0008:02"]', "expected CREATOR:gggg:ee"),
])
def test_bad_deidentify_fields(tmp_path, fields, message):
    path = tmp_path / "routes.toml"
    path.write_text(f'[[destinations]]\nname = "out"\nstow_url = "http://127.0.0.1:9/x"\n{fields}\n')
    with pytest.raises(RoutesError, match=message):
        load_routes(path)
    path.write_text(f'[[destinations]]\nname = "out"\nstow_url = "http://127.0.0.1:9/x"\n{DEID}'
                    'safe_private = ["ACME 1.0:0009:02"]\n')
    spec = load_routes(path).destinations["out"].deidentify
    assert (spec.project, spec.options.selected(), spec.allow_burned_in, spec.safe_private) == (
        "trial-a", ["retain_modified_dates"], False, {("ACME 1.0", 9, 2)})
