"""The client's whole API against the servers people run: our archive and Orthanc
1.10.1 with its DICOMweb plugin 1.7 (issue 16), sync and async, on the same data.

Where a peer lacks a feature the test asserts the typed error the client raises;
``GAPS`` is that list, and ``dicomweb_client/README.md``'s "Servers" table is
checked against it (``test_readme_table_matches``).
"""
from __future__ import annotations

import inspect
import io
import re
from pathlib import Path

import pydicom
import pytest
from PIL import Image

from dicomweb_client import (
    AsyncDICOMwebClient,
    BadRequest,
    DICOMwebClient,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    ServerError,
    StoreError,
)
from tests.client.conftest import Runner
from tests.helpers import make_dataset

from .conftest import DATA

README = Path(__file__).resolve().parents[2] / "dicomweb_client" / "README.md"
ORTHANC, STATIC = "orthanc", "static"
PEERS = ("ours", ORTHANC, STATIC)
LEVELS = ("study", "series", "instance", "instance_frames")

#: method -> {peer: typed error}; every other (method, peer) works.
GAPS: dict[str, dict[str, type]] = {
    **{f"retrieve_{level}_rendered": {STATIC: NotFound} for level in LEVELS},
    **{f"iter_{level}_rendered": {ORTHANC: BadRequest, STATIC: NotFound} for level in LEVELS},
    **{f"retrieve_{level}_thumbnail": {ORTHANC: NotFound, STATIC: NotFound} for level in LEVELS},
    **{f"delete_{level}": {ORTHANC: MethodNotAllowed, STATIC: MethodNotAllowed} for level in ("study", "series", "instance")},
    "store_instances": {STATIC: MethodNotAllowed},
}


def uids(ds) -> tuple[str, str, str]:
    return str(ds.StudyInstanceUID), str(ds.SeriesInstanceUID), str(ds.SOPInstanceUID)


def frame_bytes(ds, n: int) -> bytes:
    size = ds.Rows * ds.Columns * ds.BitsAllocated // 8
    return ds.PixelData[(n - 1) * size : n * size]


async def _runner(mode: str, peer):
    is_async = mode == "async"
    client = (AsyncDICOMwebClient if is_async else DICOMwebClient)(peer.url, retries=0)
    yield Runner(client, is_async)
    if is_async:
        await client.aclose()
    else:
        client.close()


@pytest.fixture(params=["sync", "async"])
async def api(request, peer):
    """A sync or async client of a peer that stores (ours, Orthanc)."""
    async for runner in _runner(request.param, peer):
        yield runner


@pytest.fixture(params=["sync", "async"])
async def any_api(request, any_peer):
    """A sync or async client of any peer, the static tree included."""
    async for runner in _runner(request.param, any_peer):
        yield runner


def _calls() -> dict[str, tuple]:
    """Arguments of every read-only public method, on ``DATA``."""
    s, se, i = uids(DATA.multiframe)
    return {
        "search_for_studies": ((), {"search_filters": {"PatientID": "PEER1"}}),
        "search_for_series": ((s,), {}),
        "search_for_instances": ((s, se), {}),
        "retrieve_study": ((s,), {}),
        "iter_study": ((s,), {}),
        "retrieve_series": ((s, se), {}),
        "iter_series": ((s, se), {}),
        "retrieve_instance": ((s, se, i), {}),
        "retrieve_study_metadata": ((s,), {}),
        "retrieve_series_metadata": ((s, se), {}),
        "retrieve_instance_metadata": ((s, se, i), {}),
        "retrieve_instance_frames": ((s, se, i, [3]), {}),
        "iter_instance_frames": ((s, se, i, [2]), {}),
        "retrieve_study_rendered": ((s,), {}),
        "iter_study_rendered": ((s,), {}),
        "retrieve_series_rendered": ((s, se), {}),
        "iter_series_rendered": ((s, se), {}),
        "retrieve_instance_rendered": ((s, se, i), {}),
        "iter_instance_rendered": ((s, se, i), {}),
        "retrieve_instance_frames_rendered": ((s, se, i, [2]), {}),
        "iter_instance_frames_rendered": ((s, se, i, [2]), {}),
        "retrieve_study_thumbnail": ((s,), {}),
        "retrieve_series_thumbnail": ((s, se), {}),
        "retrieve_instance_thumbnail": ((s, se, i), {}),
        "retrieve_instance_frames_thumbnail": ((s, se, i, [1]), {}),
    }


async def test_every_read_method_works_or_raises_its_documented_error(any_api, any_peer):
    for name, (args, kwargs) in _calls().items():
        expected = GAPS.get(name, {}).get(any_peer.name)
        if expected is None:
            assert await getattr(any_api, name)(*args, **kwargs), name
        else:
            with pytest.raises(expected):
                await getattr(any_api, name)(*args, **kwargs)


async def test_read_only_static_tree(any_api, any_peer):
    """Values from the static tree (and the same calls on the others): instance, metadata, frame, bulk data."""
    m = DATA.multiframe
    s, se, i = uids(m)
    assert (await any_api.retrieve_instance(s, se, i)).PixelData == m.PixelData
    meta = await any_api.retrieve_instance_metadata(s, se, i)
    assert await any_api.retrieve_instance_frames(s, se, i, [3]) == [frame_bytes(m, 3)]
    assert b"".join(await any_api.iter_bulkdata(meta["7FE00010"]["BulkDataURI"])) == m.PixelData
    assert DATA.other_study.StudyInstanceUID in [x["0020000D"]["Value"][0] for x in await any_api.search_for_studies()]


async def test_writes_where_a_peer_refuses_them(any_api, any_peer):
    ds = make_dataset(PatientID="PEER-WRITE")
    s, se, i = uids(ds)
    expected = GAPS["store_instances"].get(any_peer.name)
    if expected is None:
        assert (await any_api.store_instances([ds])).ok
    else:
        with pytest.raises(expected):
            await any_api.store_instances([ds])
    for name, args in (("delete_instance", (s, se, i)), ("delete_series", (s, se)), ("delete_study", (s,))):
        expected = GAPS[name].get(any_peer.name)
        if expected is None:
            await getattr(any_api, name)(*args)
            with pytest.raises(NotFound):  # the only instance: its series and study went with it
                await any_api.retrieve_study_metadata(s)
            break
        with pytest.raises(expected):
            await getattr(any_api, name)(*args)


async def test_search(api):
    m = DATA.multiframe
    s, se, i = uids(m)
    studies = await api.search_for_studies(search_filters={"PatientID": "PEER1"}, fields=["StudyDescription"])
    assert [x["0020000D"]["Value"][0] for x in studies] == [s]
    assert studies[0]["00081030"]["Value"] == ["peer study"]
    assert studies[0]["00201208"]["Value"] == [2]  # NumberOfStudyRelatedInstances
    series = await api.search_for_series(s)
    assert [x["0020000E"]["Value"][0] for x in series] == [se]
    instances = await api.search_for_instances(s, se, get_remaining=True, limit=1)
    assert sorted(x["00080018"]["Value"][0] for x in instances) == sorted([i, DATA.second.SOPInstanceUID])
    assert await api.search_for_studies(search_filters={"PatientID": "NOBODY"}) == []


async def test_retrieve_instances_metadata_frames_bulkdata(api):
    m = DATA.multiframe
    s, se, i = uids(m)
    study = await api.retrieve_study(s)
    assert sorted(d.SOPInstanceUID for d in study) == sorted([i, DATA.second.SOPInstanceUID])
    assert {d.SOPInstanceUID: d.PixelData for d in await api.iter_series(s, se)}[i] == m.PixelData
    raw = await api.retrieve_instance(s, se, i, raw=True)
    assert pydicom.dcmread(io.BytesIO(raw)).PixelData == m.PixelData
    meta = await api.retrieve_instance_metadata(s, se, i)
    assert meta["00080018"]["Value"] == [i] and meta["00280008"]["Value"] in ([3], ["3"])
    assert len(await api.retrieve_study_metadata(s)) == 2 and len(await api.retrieve_series_metadata(s, se)) == 2
    assert await api.retrieve_instance_frames(s, se, i, [3, 1]) == [frame_bytes(m, 3), frame_bytes(m, 1)]
    assert await api.iter_instance_frames(s, se, i, [2]) == [frame_bytes(m, 2)]
    octet = await api.retrieve_instance_frames(s, se, i, [2], media_types=("application/octet-stream",))
    assert octet == [frame_bytes(m, 2)]
    assert b"".join(await api.retrieve_bulkdata(meta["7FE00010"]["BulkDataURI"])) == m.PixelData
    assert b"".join(await api.iter_bulkdata(meta["7FE00010"]["BulkDataURI"])) == m.PixelData


async def test_rendered(api):
    s, se, i = uids(DATA.multiframe)
    jpeg = Image.open(io.BytesIO(await api.retrieve_instance_rendered(s, se, i)))
    assert (jpeg.format, jpeg.size) == ("JPEG", (6, 4))
    png = Image.open(io.BytesIO(await api.retrieve_instance_frames_rendered(s, se, i, [2], media_types=("image/png",))))
    assert (png.format, png.size) == ("PNG", (6, 4))


async def test_errors(api, peer):
    s, se, i = uids(DATA.multiframe)
    with pytest.raises(NotFound):
        await api.retrieve_study_metadata("1.2.3.404")
    with pytest.raises(NotFound):
        await api.retrieve_study("1.2.3.404")
    # a frame past the end: 404 here, 400 from Orthanc
    with pytest.raises(BadRequest if peer.name == ORTHANC else NotFound):
        await api.retrieve_instance_frames(s, se, i, [9])
    # a transfer syntax the server cannot produce: 406 here (JPEG XL; JPEG 2000 it produces:
    # docs/transcoding.md), 500 from Orthanc (asked for JPEG 2000)
    ts = "1.2.840.10008.1.2.4.90" if peer.name == ORTHANC else "1.2.840.10008.1.2.4.110"
    with pytest.raises(ServerError if peer.name == ORTHANC else NotAcceptable):
        await api.retrieve_instance(s, se, i, media_types=(("application/dicom", ts),))


async def test_store_partial_failure(api, peer):
    """One instance of the target study, one of another: PS3.18 says 202 with both lists;
    Orthanc answers 409 (StoreError) although it stored the good one."""
    s = DATA.other_study.StudyInstanceUID  # not the study the other tests count
    good, wrong = make_dataset(study=s, PatientID="PEER2"), make_dataset()
    if peer.name == ORTHANC:
        with pytest.raises(StoreError) as info:
            await api.store_instances([good, wrong], study_instance_uid=s)
        result = info.value.result
    else:
        result = await api.store_instances([good, wrong], study_instance_uid=s)
        assert result.status_code == 202
    assert [r.sop_instance_uid for r in result.referenced] == [good.SOPInstanceUID]
    assert [f.sop_instance_uid for f in result.failed] == [wrong.SOPInstanceUID]
    found = await api.search_for_instances(s, search_filters={"SOPInstanceUID": good.SOPInstanceUID})
    assert len(found) == 1
    with pytest.raises(StoreError) as info:  # nothing stored: 409 everywhere
        await api.store_instances([make_dataset()], study_instance_uid=s)
    assert info.value.status_code == 409 and len(info.value.result.failed) == 1


def _snippet(path: Path, heading: str) -> str:
    """The first ``python`` code block after ``heading`` in ``path``."""
    text = path.read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(heading):], re.DOTALL).group(1)


@pytest.mark.parametrize("readme,heading,prints", [
    (README, "# dicomweb_client", ["1 stored", "bytes of frame 1"]),
    (README.parents[1] / "README.md", "## Client library", ["CompressedSamples^MR1"]),
], ids=["client-readme", "readme"])
def test_readme_example_runs_unchanged(peer, tmp_path, readme, heading, prints):
    """The READMEs' client examples against each peer: only the URL differs."""
    import subprocess
    import sys

    code = _snippet(readme, heading)
    assert "http://127.0.0.1:8080" in code
    script = tmp_path / "readme_example.py"
    script.write_text(code.replace("http://127.0.0.1:8080", peer.url))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert all(p in run.stdout for p in prints), run.stdout
    assert run.stderr == ""


def test_readme_table_matches():
    """README "Servers" table == GAPS, and it lists every public method."""
    text = README.read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|\s*$", text, re.MULTILINE))
    public = {n for n, f in inspect.getmembers(DICOMwebClient, inspect.isfunction)
              if not n.startswith("_") and (n.startswith(("search_", "retrieve_", "iter_", "store_", "delete_")))}
    assert public <= set(rows), sorted(public - set(rows))
    for name in public:
        cells = [c.strip() for c in rows[name].split("|")]
        for cell, peer in zip(cells, PEERS, strict=True):
            expected = GAPS.get(name, {}).get(peer)
            assert cell == ("works" if expected is None else f"`{expected.__name__}`"), (name, peer, cell)


def test_cli_search_table_and_retrieve(peer, capsys, tmp_path):
    """``dicomweb search`` prints the same table of studies from each server (issue 15 item 8);
    ``dicomweb retrieve`` writes the study's files."""
    from dicomweb_client import cli

    assert cli.main(["search", peer.url, "--filter", "PatientID=PEER1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["Peer,", "Multi", "(PEER1)", "2024-01-01", "CT", "peer", "study", "1", "2",
                                DATA.multiframe.StudyInstanceUID]
    assert lines[-1] == "1 study"
    assert cli.main(["search", peer.url, "--level", "instances", "--study", DATA.multiframe.StudyInstanceUID,
                     "--filter", f"SOPInstanceUID={DATA.multiframe.SOPInstanceUID}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["CT", "Image", "Storage", "6x4", "x3", DATA.multiframe.SOPInstanceUID]
    s = DATA.multiframe.StudyInstanceUID
    assert cli.main(["retrieve", peer.url, "--study", s, "--out", str(tmp_path)]) == 0
    written = {p.name: pydicom.dcmread(p).PixelData for p in tmp_path.glob("*.dcm")}
    assert written == {f"{ds.SOPInstanceUID}.dcm": ds.PixelData for ds in (DATA.multiframe, DATA.second)}


def test_missing_orthanc_fails_with_the_install_command(monkeypatch):
    """Never a silent skip: without Orthanc the suite fails naming the apt-get command;
    DICOMWEB_PEERS=skip skips on purpose."""
    from . import conftest

    monkeypatch.setattr(conftest, "ORTHANC_BINARY", "/nonexistent/Orthanc")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("DICOMWEB_PEERS", raising=False)
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y orthanc orthanc-dicomweb"):
        conftest.orthanc_paths()
    monkeypatch.setenv("DICOMWEB_PEERS", "skip")
    with pytest.raises(pytest.skip.Exception):
        conftest.orthanc_paths()


async def test_a_jpeg_2000_instance_comes_back_as_stored(api, peer):
    """The client's default Accept asks for instances as stored. Orthanc refuses the list
    (400); the single value ``transfer-syntax=*`` it is sent next keeps the stored JPEG 2000
    (before, the plain form asked Orthanc for Explicit VR Little Endian: a transcode)."""
    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid

    ds = pydicom.dcmread(get_testdata_file("MR_small_jp2klossless.dcm"))
    ds.StudyInstanceUID = DATA.other_study.StudyInstanceUID  # not the study the other tests count
    ds.SeriesInstanceUID = generate_uid()
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()  # MR_small's UIDs are loaded
    ds.PatientID = "PEER2"
    await api.store_instances([ds], study_instance_uid=ds.StudyInstanceUID)
    got = await api.retrieve_instance(ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID)
    assert got.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.90"
    assert got.PixelData == ds.PixelData
