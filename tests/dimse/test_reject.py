"""A rejection note stored by C-STORE (IHE IOCM) hides what it names from C-FIND and
C-GET (and from QIDO-RS: the same index), on the SQLite and in-memory indexes; the
in-memory index keeps it hidden after a restart (its journal remembers the rejection)."""

from __future__ import annotations

from pynetdicom.sop_class import StudyRootQueryRetrieveInformationModelFind

from dicomweb_server.dimse import status as S
from tests.helpers import make_dataset, rejection_note

from .test_query_retrieve import _c_get, _find, _ident


def test_a_rejection_note_by_c_store_hides_from_c_find_and_c_get(dimse):
    st = "1.2.826.0.1.3680043.8.498.77"
    dss = [make_dataset(study=st, series=st + ".1", PatientID="REJ", InstanceNumber=n) for n in (1, 2)]
    dss.append(make_dataset(study=st, series=st + ".2", modality="MR", sop_class="1.2.840.10008.5.1.4.1.1.4",
                            PatientID="REJ"))
    note = rejection_note([dss[0], dss[2]], code="113037")
    assert dimse.store(dss) == [S.SUCCESS] * 3
    assert dimse.store([note]) == [S.SUCCESS]

    def find(level, **keys):
        return _find(dimse, StudyRootQueryRetrieveInformationModelFind, {"QueryRetrieveLevel": level, **keys})

    def check():
        (study,) = find("STUDY", StudyInstanceUID=st, ModalitiesInStudy="", NumberOfStudyRelatedInstances="")
        assert list(study.ModalitiesInStudy) == ["CT", "KO"] and study.NumberOfStudyRelatedInstances == 2
        assert sorted(d.SeriesInstanceUID for d in find("SERIES", StudyInstanceUID=st, SeriesInstanceUID="")) == \
            sorted([st + ".1", note.SeriesInstanceUID])
        assert sorted(d.SOPInstanceUID for d in find("IMAGE", StudyInstanceUID=st, SeriesInstanceUID=st + ".1",
                                                     SOPInstanceUID="")) == [dss[1].SOPInstanceUID]
        responses, received = _c_get(dimse, dss + [note], _ident("STUDY", StudyInstanceUID=st))
        assert responses[-1][0].Status == S.SUCCESS
        assert sorted(d.SOPInstanceUID for d in received) == sorted([dss[1].SOPInstanceUID, note.SOPInstanceUID])
        responses, received = _c_get(dimse, dss, _ident("IMAGE", StudyInstanceUID=st, SeriesInstanceUID=st + ".2",
                                                        SOPInstanceUID=dss[2].SOPInstanceUID))
        assert received == [] and responses[-1][0].NumberOfCompletedSuboperations in (0, None)

    check()
    assert dimse.http.get(f"/studies/{st}/series/{st}.2").status_code == 404
    dimse.server.restart()  # the in-memory index re-indexes the files: the rejected stay hidden
    check()
