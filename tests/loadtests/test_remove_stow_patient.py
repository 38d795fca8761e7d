"""The capacity runner keeps the data set at its reference size: the STOW-RS load
patient's studies are deleted (after the run's last step, and what earlier runs left
before the first), on our archive through DICOMweb DELETE and on Orthanc through its
REST API; other patients' studies stay."""

from __future__ import annotations

import httpx
import pytest

from loadtests import capacity, common
from loadtests.capacity import Orthanc
from tests.helpers import LiveServer, make_dataset, multipart, to_bytes

LOAD = "ZZLOADTEST-STOW"


def _stow(url: str, patient: str, n: int) -> str:
    first = make_dataset(rows=8, columns=8)
    first.PatientID = patient
    datasets = [first]
    for _ in range(n - 1):
        ds = make_dataset(study=first.StudyInstanceUID, series=first.SeriesInstanceUID, rows=8, columns=8)
        ds.PatientID = patient
        datasets.append(ds)
    body, _ = multipart([to_bytes(ds) for ds in datasets], boundary="removetest1")
    ctype = 'multipart/related; type="application/dicom"; boundary=removetest1'  # Orthanc: no quoted boundary
    r = httpx.post(f"{url}/studies", content=body, headers={"Content-Type": ctype}, timeout=60)
    assert r.status_code == 200, r.text
    return first.StudyInstanceUID


def _check(url: str) -> None:
    kept = _stow(url, "OTHER-1", 2)
    _stow(url, LOAD, 3)
    _stow(url, LOAD, 2)
    assert common.stow_patient_count(url, LOAD) == 5
    assert common.remove_stow_patient(url, LOAD) == 2
    assert common.stow_patient_count(url, LOAD) == 0
    r = httpx.get(f"{url}/studies", params={"PatientID": "OTHER-1"}, timeout=30)
    assert [s["0020000D"]["Value"][0] for s in r.json()] == [kept]
    assert common.remove_stow_patient(url, LOAD) == 0


def test_ours(tmp_path):
    srv = LiveServer(tmp_path / "data").start()
    try:
        _check(srv.url)
    finally:
        srv.stop()


def test_orthanc(tmp_path):
    try:
        peer = Orthanc(tmp_path / "orthanc").start()
    except FileNotFoundError as e:
        pytest.fail(f"Orthanc is part of the test setup (scripts/test.sh installs it): {e}")
    try:
        _check(peer.url)
    finally:
        peer.stop()


def test_nothing_is_deleted_between_steps(monkeypatch, tmp_path):
    """The STOW-RS steps' instances are deleted after every server's last step, never
    between steps: a file created right after mass deletion costs the kernel up to ~0.7 ms
    on ext4 without a journal (benchmarks/file_create.py), which the next step measured."""
    events = []
    monkeypatch.setattr(capacity, "write_inputs", lambda manifest, host, workdir: {
        "stow": ["body"], "qido": ["q"], "_stow_body": ["1000"]})
    monkeypatch.setattr(capacity, "run_wrk", lambda host, args, c, *a: events.append(("step", host, c)) or {})
    monkeypatch.setattr(capacity, "step_row", lambda op, c, s, body, answers: {})
    monkeypatch.setattr(common, "stow_patient_count", lambda host, patient: 0)
    monkeypatch.setattr(common, "remove_stow_patient", lambda host, patient: events.append(("delete", host)))
    servers = [("ours", "http://a", None), ("orthanc", "http://b", None)]
    capacity.run_servers(servers, {"stow": {"PatientID": LOAD}}, ["qido", "stow"], [8, 32], 1, 1, tmp_path, True)
    assert events == [("step", "http://a", 8), ("step", "http://b", 8), ("step", "http://a", 32),
                      ("step", "http://b", 32)] * 2 + [("delete", "http://a"), ("delete", "http://b")]


def test_rounds_alternate_the_order_of_the_servers(monkeypatch, tmp_path):
    """``--rounds 2``: every step again at once, the servers in the reverse order (the server
    measured first had an advantage on this machine), each row noting its round; the
    STOW-RS steps stay the last."""
    events = []
    monkeypatch.setattr(capacity, "write_inputs", lambda manifest, host, workdir: {
        "stow": ["body"], "_stow_body": ["1000"]})
    monkeypatch.setattr(capacity, "run_wrk", lambda host, args, c, *a: events.append((host, c)) or {})
    monkeypatch.setattr(capacity, "step_row", lambda op, c, s, body, answers: {})
    monkeypatch.setattr(common, "stow_patient_count", lambda host, patient: 0)
    monkeypatch.setattr(common, "remove_stow_patient", lambda host, patient: None)
    servers = [("ours", "http://a", None), ("orthanc", "http://b", None)]
    rows = capacity.run_servers(servers, {"stow": {"PatientID": LOAD}}, ["stow"], [8, 32], 1, 1, tmp_path, True,
                                rounds=2)
    assert events == [("http://a", 8), ("http://b", 8), ("http://b", 8), ("http://a", 8),
                      ("http://a", 32), ("http://b", 32), ("http://b", 32), ("http://a", 32)]
    assert [r["round"] for r in rows["ours"]] == [0, 1, 0, 1]


def test_keep_stow_leaves_the_stored_instances(monkeypatch, tmp_path):
    """``--keep-stow``: servers started on new folders for the run keep what the STOW-RS
    steps stored (deleting it only slows file creation for whatever runs next)."""
    events = []
    monkeypatch.setattr(capacity, "write_inputs", lambda manifest, host, workdir: {
        "stow": ["body"], "_stow_body": ["1000"]})
    monkeypatch.setattr(capacity, "run_wrk", lambda host, args, c, *a: events.append(("step", host)) or {})
    monkeypatch.setattr(capacity, "step_row", lambda op, c, s, body, answers: {})
    monkeypatch.setattr(common, "stow_patient_count", lambda host, patient: 0)
    monkeypatch.setattr(common, "remove_stow_patient", lambda host, patient: events.append(("delete", host)))
    capacity.run_servers([("ours", "http://a", None)], {"stow": {"PatientID": LOAD}}, ["stow"], [8], 1, 1,
                         tmp_path, True, keep_stow=True)
    assert events == [("step", "http://a")]
