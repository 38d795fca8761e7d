"""Big indexes for the scale benchmarks (benchmarks/scale.py): rows written straight
into the index tables in bulk (SQLite ``executemany`` in large transactions,
PostgreSQL ``COPY``), because 1M instances through ``Index.add`` (a few statements
and round trips per instance, a durable commit per batch) would take most of an hour
on PostgreSQL here. The tables are the archive's own (created by opening the index),
and the rows hold what ``Index.add`` would have written for such instances:

- 10 instances per study: 2 series of 5, each series one modality (CT 40 %, MR 30 %,
  US 15 %, CR 10 %, XA 5 %), so ModalitiesInStudy has one or two values; computed
  counts (NumberOfStudyRelatedSeries/Instances, NumberOfSeriesRelatedInstances) set.
- 2 studies per patient (PatientID ``P<n>``); PatientName ``FAMILY^GIVEN`` from 2,000
  family names and 200 given names; StudyDate uniform over 2010-2024.
- Study and series JSON (what QIDO-RS answers) made per row from a real instance's
  JSON with the row's values; instance metadata: that instance's JSON as is.
- ``sample`` instances, spread over the whole index, also get a real file (a 256x256
  16-bit MR image, Explicit VR Little Endian, ~129 KiB) at their path, and the row of
  that file as ``describe_instance`` reads it: WADO-RS retrieves those.

The build is not the measurement: SQLite loads with ``synchronous=OFF`` (one fsync at
the end), PostgreSQL with ``synchronous_commit=off`` for the loading session only,
then ``VACUUM ANALYZE`` (what autovacuum does to a table that grew).
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import orjson

from dicomweb_server.dicom.attributes import DERIVED
from dicomweb_server.dicom.instance import InstanceRecord, describe_instance, instance_path
from dicomweb_server.store.sql import cols, join_multi

MODALITIES = ["CT"] * 8 + ["MR"] * 6 + ["US"] * 3 + ["CR"] * 2 + ["XA"]
SYLLABLES = ["AN", "BER", "CO", "DA", "EL", "FIN", "GAR", "HOL", "IN", "JO", "KA", "LI", "MIL", "NO", "OS",
             "PER", "QUI", "RO", "SAN", "TOR", "UL", "VAN", "WE", "XI", "YA", "ZE"]
ROOT = "1.2.826.0.1.3680043.8.498.77"  # pydicom's UID root + a branch of our own
STUDIES_PER_CHUNK = 5000


def family_names(n: int = 2000) -> list[str]:
    rnd = random.Random(7)
    names: set[str] = set()
    while len(names) < n:
        names.add("".join(rnd.choice(SYLLABLES) for _ in range(rnd.choice((2, 3)))))
    return sorted(names)


FAMILY = family_names()
GIVEN = [f"G{k:03d}" for k in range(200)]

# DICOM JSON tags of the study/series values a row varies (PS3.18 Annex F)
_STUDY_TAGS = {"StudyInstanceUID": ("0020000D", "UI"), "PatientID": ("00100020", "LO"),
               "PatientName": ("00100010", "PN"), "StudyDate": ("00080020", "DA"),
               "AccessionNumber": ("00080050", "SH")}
_SERIES_TAGS = {"SeriesInstanceUID": ("0020000E", "UI"), "Modality": ("00080060", "CS"),
                "SeriesNumber": ("00200011", "IS")}


@dataclasses.dataclass(frozen=True)
class Study:
    n: int
    uid: str
    patient_id: str
    patient_name: str
    study_date: str
    accession: str
    modalities: tuple[str, str]

    def series_uid(self, k: int) -> str:
        return f"{self.uid}.{k + 1}"

    def sop_uid(self, k: int, i: int) -> str:
        return f"{self.uid}.{k + 1}.{i + 1}"


def study(n: int, run: int) -> Study:
    rnd = random.Random(run * 10_000_019 + n)
    return Study(n, f"{ROOT}.{run}.{n}", f"P{n // 2}", f"{rnd.choice(FAMILY)}^{rnd.choice(GIVEN)}",
                 f"20{rnd.randint(10, 24):02d}{rnd.randint(1, 12):02d}{rnd.randint(1, 28):02d}", f"A{n}",
                 (rnd.choice(MODALITIES), rnd.choice(MODALITIES)))


def _json_with(template: dict, tags: dict, values: dict) -> bytes:
    doc = dict(template)
    for keyword, value in values.items():
        tag, vr = tags[keyword]
        doc[tag] = {"vr": vr, "Value": [{"Alphabetic": value} if vr == "PN" else value]}
    return orjson.dumps(doc)


class Rows:
    """Row tuples of the three tables for studies ``0..n_studies-1`` (pk = n + 1)."""

    def __init__(self, template: InstanceRecord, run: int) -> None:
        self.t = template
        self.run = run
        self.scols, self.secols, self.icols = cols("study"), cols("series"), cols("instance")
        self.study_doc = orjson.loads(template.study_json)
        self.series_doc = orjson.loads(template.series_json)
        self.pixel = orjson.dumps(template.pixel) if template.pixel is not None else None
        self.real: dict[str, InstanceRecord] = {}  # SOP Instance UID -> record of its real file

    def study_row(self, st: Study) -> tuple:
        values = {"StudyInstanceUID": st.uid, "PatientID": st.patient_id, "PatientName": st.patient_name,
                  "StudyDate": st.study_date, "AccessionNumber": st.accession}
        row = dict(self.t.study, **values)
        for a in DERIVED:  # the date-time columns of StudyDate (+ the template's StudyTime, no offset)
            if a.level == "study" and row.get(a.keyword):
                row[a.keyword] = st.study_date + row[a.keyword][8:]
        return (st.n + 1, *(row[c] for c in self.scols), join_multi(set(st.modalities)),
                join_multi({self.t.sop_class_uid}), 2, 10, _json_with(self.study_doc, _STUDY_TAGS, values))

    def series_rows(self, st: Study) -> Iterator[tuple]:
        for k in range(2):
            values = {"SeriesInstanceUID": st.series_uid(k), "Modality": st.modalities[k], "SeriesNumber": k + 1}
            row = dict(self.t.series, **values)
            yield (2 * st.n + k + 1, st.n + 1, *(row[c] for c in self.secols), 5,
                   _json_with(self.series_doc, _SERIES_TAGS, values))

    def instance_rows(self, st: Study) -> Iterator[tuple]:
        t = self.t
        for k in range(2):
            for i in range(5):
                sop = st.sop_uid(k, i)
                rec = self.real.get(sop)
                if rec is None:
                    inst = dict(t.instance, SOPInstanceUID=sop, InstanceNumber=i + 1)
                    tail = (t.transfer_syntax_uid, instance_path(st.uid, st.series_uid(k), sop), t.size, self.pixel,
                            t.metadata)
                else:
                    inst = rec.instance
                    tail = (rec.transfer_syntax_uid, rec.path, rec.size,
                            orjson.dumps(rec.pixel) if rec.pixel is not None else None, rec.metadata)
                yield (10 * st.n + 5 * k + i + 1, 2 * st.n + k + 1, *(inst[c] for c in self.icols), *tail)

    def columns(self) -> dict[str, list[str]]:
        return {
            "study": ["pk", *self.scols, "ModalitiesInStudy", "SOPClassesInStudy", "NumberOfStudyRelatedSeries",
                      "NumberOfStudyRelatedInstances", "_json"],
            "series": ["pk", "study_pk", *self.secols, "NumberOfSeriesRelatedInstances", "_json"],
            "instance": ["pk", "series_pk", *self.icols, "_transfer_syntax", "_path", "_size", "_pixel", "_metadata"],
        }

    def chunks(self, n_studies: int) -> Iterator[tuple[list, list, list]]:
        for start in range(0, n_studies, STUDIES_PER_CHUNK):
            studies = [study(n, self.run) for n in range(start, min(n_studies, start + STUDIES_PER_CHUNK))]
            yield ([self.study_row(s) for s in studies], [r for s in studies for r in self.series_rows(s)],
                   [r for s in studies for r in self.instance_rows(s)])


def make_file(blobs: Path, st: Study, k: int, i: int) -> InstanceRecord:
    """A real file for one instance of ``st`` (the values its rows hold), and its record."""
    from tests.helpers import MR_IMAGE_STORAGE, make_dataset

    ds = make_dataset(study=st.uid, series=st.series_uid(k), sop=st.sop_uid(k, i), sop_class=MR_IMAGE_STORAGE,
                      modality=st.modalities[k], rows=256, columns=256, PatientID=st.patient_id,
                      PatientName=st.patient_name, StudyDate=st.study_date, AccessionNumber=st.accession,
                      SeriesNumber=k + 1, InstanceNumber=i + 1)
    rel = instance_path(st.uid, st.series_uid(k), st.sop_uid(k, i))
    path = blobs / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return dataclasses.replace(describe_instance(path), path=rel)


def template_record(tmp: Path) -> InstanceRecord:
    st = study(0, 0)
    rec = make_file(tmp, st, 0, 0)
    return rec


def sample_files(rows: Rows, blobs: Path, n_studies: int, sample: int, seed: int = 3) -> list[str]:
    """Write ``sample`` real files spread over the index; returns their WADO-RS paths."""
    rnd = random.Random(seed)
    picks = sorted(rnd.sample(range(n_studies * 10), min(sample, n_studies * 10)))
    urls = []
    for p in picks:
        st = study(p // 10, rows.run)
        k, i = divmod(p % 10, 5)
        rec = make_file(blobs, st, k, i)
        rows.real[rec.sop_uid] = rec
        urls.append(f"/studies/{st.uid}/series/{st.series_uid(k)}/instances/{st.sop_uid(k, i)}")
    return urls


def load_sqlite(path: Path, rows: Rows, n_studies: int) -> None:
    from dicomweb_server.store.sqlite import SQLiteIndex

    SQLiteIndex(path).close()  # the archive's schema
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")
    names = rows.columns()
    sql = {t: f"INSERT INTO {t} ({','.join(c)}) VALUES ({','.join('?' * len(c))})" for t, c in names.items()}
    for study_rows, series_rows, instance_rows in rows.chunks(n_studies):
        con.execute("BEGIN")
        con.executemany(sql["study"], study_rows)
        con.executemany(sql["series"], series_rows)
        con.executemany(sql["instance"], instance_rows)
        con.execute("COMMIT")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def load_postgresql(url: str, rows: Rows, n_studies: int) -> None:
    import psycopg

    from dicomweb_server.store.postgresql import PostgreSQLIndex

    PostgreSQLIndex(url).close()  # the archive's schema (migrated)
    names = rows.columns()
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("SET synchronous_commit = off")  # this loading session only
        for study_rows, series_rows, instance_rows in rows.chunks(n_studies):
            with con.transaction(), con.cursor() as cur:
                for table, data in (("study", study_rows), ("series", series_rows), ("instance", instance_rows)):
                    # pk given: OVERRIDING SYSTEM VALUE is for INSERT only, so COPY the other columns in
                    # pk order and check below that the identity numbered them as we did
                    with cur.copy(f"COPY {table} ({','.join(names[table][1:])}) FROM STDIN") as copy:
                        for r in data:
                            copy.write_row(r[1:])
        for table, per in (("study", 1), ("series", 2), ("instance", 10)):
            got = con.execute(f"SELECT min(pk), max(pk), count(*) FROM {table}").fetchone()
            assert got == (1, per * n_studies, per * n_studies), (table, got)
        con.execute("VACUUM ANALYZE")
