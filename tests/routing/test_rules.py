"""The routes file: rules match exactly what QIDO-RS finds; a bad file is refused
with its line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dicomweb_server.archive import Archive
from dicomweb_server.dicom.instance import describe_instance
from dicomweb_server.dicom.matching import parse_query
from dicomweb_server.dicom.multipart import SpooledPart
from dicomweb_server.routing.rules import RoutesError, load_routes
from dicomweb_server.settings import Settings
from tests.helpers import MR_IMAGE_STORAGE, make_dataset

HEAD = '[[destinations]]\nname = "pacs"\nstow_url = "http://pacs.example/dicom-web"\n'

QUERIES = [
    {},
    {"Modality": "CT"},
    {"Modality": "C*"},
    {"StudyDescription": "*HEAD*"},
    {"StudyDescription": "*HEAD*", "Modality": "MR"},
    {"PatientName": "doe*"},
    {"PatientName": "DOE^JOHN"},
    {"StudyDate": "20240101-20240131"},
    {"StudyDate": "-20231231"},
    {"SOPClassUID": MR_IMAGE_STORAGE},
    {"SeriesNumber": "3"},
    {"PatientID": "P?"},
    {"AccessionNumber": "A1"},
    {"StudyTime": "10-12"},
]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    data = tmp_path_factory.mktemp("rules") / "data"
    archive = Archive.open(Settings(data_dir=data, index="sqlite"))
    variants = [
        dict(modality="CT", StudyDescription="CT HEAD W/O", PatientName="Doe^John", StudyDate="20240105",
             SeriesNumber=3, AccessionNumber="A1", StudyTime="101500"),
        dict(modality="MR", sop_class=MR_IMAGE_STORAGE, StudyDescription="MR HEAD", PatientName="DOE^JANE",
             StudyDate="20231220", SeriesNumber=1, PatientID="P2", StudyTime="093000"),
        dict(modality="CR", StudyDescription="chest", PatientName="Roe^Richard", StudyDate="20240201",
             PatientID="Q1", StudyTime="120000"),
        dict(modality="CT", StudyDescription="head", PatientName="doe", StudyDate="", SeriesNumber=3,
             PatientID="P"),
        dict(modality="OT", pixels=False, PatientName="", AccessionNumber="A10"),
    ]
    records = []
    for i, v in enumerate(variants):
        path = data / "tmp" / f"in{i}.dcm"
        make_dataset(**v).save_as(path, enforce_file_format=True)
        records.append(describe_instance(path))
        outcome = archive.store([SpooledPart(headers={}, path=path, size=os.path.getsize(path), complete=True)])
        assert len(outcome.stored) == 1
    yield archive, records
    archive.close()


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: "&".join(f"{k}={v}" for k, v in q.items()) or "all")
def test_a_rule_matches_what_qido_finds(tmp_path, stored, query):
    archive, records = stored
    match = ", ".join(f'{k} = "{v}"' for k, v in query.items())
    f = tmp_path / "routes.toml"
    f.write_text(HEAD + f'[[rules]]\nmatch = {{ {match} }}\ndestinations = ["pacs"]\n')
    (rule,) = load_routes(f).rules
    found = {h.sop_uid for h in archive.index.search(parse_query("instance", list(query.items())))}
    assert {r.sop_uid for r in records if rule.matches(r)} == found
    assert 0 < len(found) < len(records) or not query


def test_a_list_of_values_matches_any_of_them(tmp_path, stored):
    _, records = stored
    f = tmp_path / "routes.toml"
    f.write_text(HEAD + '[[rules]]\nmatch = { Modality = ["CT", "MR"], StudyDescription = "*HEAD*" }\n'
                        'destinations = ["pacs"]\n')
    routes = load_routes(f)
    assert [r.series["Modality"] for r in records if routes.rules[0].matches(r)] == ["CT", "MR"]
    assert routes.destinations_for(records[0]) == [("pacs", "rule 1")]
    assert routes.destinations_for(records[2]) == []
    f.write_text(HEAD + '[[rules]]\nmatch = { Modality = "CT\\\\MR", StudyDescription = "*HEAD*" }\n'
                        'destinations = ["pacs"]\n')  # DICOM's backslash between values: the same
    assert load_routes(f).rules == routes.rules


@pytest.mark.parametrize("body, line, words", [
    ('[[destinations]]\nname = "a"\nstow_url = "ftp://x"\n', 3, "stow_url: 'ftp://x' is not an http(s) URL"),
    (HEAD + '\n[[rules]]\nname = "r"\ndestinations = ["nowhere"]\n', 7, "no destination named 'nowhere'"),
    (HEAD + '[[rules]]\ndestinations = ["pacs"]\nmatch = { Modalty = "CT" }\n', 6, "Modalty"),
    (HEAD + '[[rules]]\ndestinations = ["pacs"]\nmatch = { StudyDate = "yesterday" }\n', 6, "StudyDate"),
    (HEAD + '[[rules]]\ndestinations = ["pacs"]\nmatch = { ModalitiesInStudy = "CT" }\n', 6, "computed"),
    (HEAD + '[[rules]]\ndestinations = ["pacs"]\nflavour = 1\n', 6, "unknown field"),
    ('[[destinations]]\nname = "d"\ndimse = { ae_title = "A_TITLE_LONGER_THAN_16", host = "h", port = 104 }\n', 3,
     "ae_title: 'A_TITLE_LONGER_THAN_16' is longer than the 16 characters"),
    ('[[destinations]]\nname = "d"\n', 1, "exactly one of stow_url"),
    ('[[destinations]]\nname = "dimse:storage-commitment"\nstow_url = "http://x"\n', 2,
     "names beginning with 'dimse:' or 'job:' are the archive's own"),
    (HEAD + '[delivery]\nbatch_size = 0\n', 5, "batch_size: 0 is out of range; allowed: an integer from 1 to 1000"),
    (HEAD + '[[rules]\n', 4, "not valid TOML"),
])
def test_a_bad_file_is_refused_naming_the_line(tmp_path, body, line, words):
    f = tmp_path / "routes.toml"
    f.write_text(body)
    with pytest.raises(RoutesError) as e:
        load_routes(f)
    assert f"line {line}" in str(e.value) and words in str(e.value), str(e.value)


def test_serve_refuses_a_bad_routes_file(tmp_path, monkeypatch, capsys):
    from dicomweb_server.cli import _MALLOC_ENV, main

    for k, v in _MALLOC_ENV.items():  # else `serve` re-executes itself with them
        monkeypatch.setenv(k, v)
    f = tmp_path / "routes.toml"
    f.write_text(HEAD + '[[rules]]\ndestinations = ["nowhere"]\n')
    assert main(["serve", "--data-dir", str(tmp_path / "d"), "--routes", str(f)]) == 2
    assert "line 5" in capsys.readouterr().err


def test_dimse_destination_shape(tmp_path):
    f = tmp_path / "routes.toml"
    f.write_text('[[destinations]]\nname = "pacs"\ndimse = { ae_title = "PACS", host = "127.0.0.1", port = 11112 }\n'
                 '[[rules]]\ndestinations = ["pacs"]\n')
    d = load_routes(Path(f)).destinations["pacs"]
    assert (d.stow_url, d.dimse.ae_title, d.dimse.port, d.dimse.calling_ae_title) == (None, "PACS", 11112, "DICOMWEB")


def test_rules_are_matched_outside_the_index_writer_lock(tmp_path, monkeypatch):
    """5,000 rules took their matching time per store under the writer lock every
    process's commits wait for: the rules are matched before the commit (issue 25)."""
    from dicomweb_server.routing.rules import Routes

    routes = tmp_path / "routes.toml"
    routes.write_text(HEAD + '[[rules]]\nmatch = { Modality = "CT" }\ndestinations = ["pacs"]\n')
    archive = Archive.open(Settings(data_dir=tmp_path / "data", index="sqlite", routes_file=routes))
    held: list[bool] = []
    real = Routes.destinations_for
    monkeypatch.setattr(Routes, "destinations_for",
                        lambda self, record, *event: held.append(archive.committer._lock.locked())
                        or real(self, record, *event))
    try:
        path = archive.blobs.spool / "a.dcm"
        ds = make_dataset(modality="CT")
        ds.save_as(path, enforce_file_format=True)
        assert len(archive.store([SpooledPart(headers={}, path=path, size=os.path.getsize(path),
                                              complete=True)]).stored) == 1
        assert held == [False]  # matched once, without the lock
        assert [(r["destination"], r["SOPInstanceUID"]) for r in archive.routing.outbox.rows()] == [
            ("pacs", ds.SOPInstanceUID)]
    finally:
        archive.close()


def test_the_rule_index_answers_as_trying_every_rule(tmp_path, stored):
    """routing/matcher.py: the rules found through the index are those that trying every
    rule in order finds, and the first rule per destination is the same."""
    import random

    _, records = stored
    pool = [("Modality", ['"CT"', '"MR"', '["CT", "OT"]', '"C*"', '"CT\\\\MR"']),
            ("PatientID", ['"P"', '"P2"', '"Q1"', '"P?"', '["P1", "Q1"]']),
            ("StudyDate", ['"20240101-20240131"', '"-20231231"']),
            ("SeriesNumber", ['"3"', '"1"']), ("AccessionNumber", ['"A1"', '"A10"', '"A*"']),
            ("PatientName", ['"DOE^JANE"', '"doe*"']), ("SOPClassUID", [f'"{MR_IMAGE_STORAGE}"']),
            ("StudyDescription", ['"*HEAD*"', '"chest"'])]
    rng = random.Random(25)
    text = HEAD + "".join(f'[[destinations]]\nname = "d{i}"\nstow_url = "http://d{i}.example/x"\n' for i in range(3))
    for i in range(400):
        keys = rng.sample(pool, rng.choice((0, 1, 1, 2, 2, 3)))
        match = ", ".join(f"{k} = {rng.choice(vs)}" for k, vs in keys)
        dests = rng.sample(["pacs", "d0", "d1", "d2"], rng.choice((1, 2)))
        text += f'[[rules]]\nname = "r{i}"\nmatch = {{ {match} }}\ndestinations = {dests!r}\n'.replace("'", '"')
    f = tmp_path / "routes.toml"
    f.write_text(text)
    routes = load_routes(f)
    for record in records:
        every: dict[str, str] = {}
        for rule in routes.rules:
            if rule.matches(record):
                for d in rule.destinations:
                    every.setdefault(d, rule.name)
        assert routes.destinations_for(record) == list(every.items())
        assert every  # (the rules are varied enough to match each record somewhere)
