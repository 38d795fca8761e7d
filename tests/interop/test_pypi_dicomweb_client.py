"""The PyPI ``dicomweb-client`` (what users already have) against the real archive.

The archive runs here on a loopback port (tests/helpers.LiveServer); every call the PyPI
client offers runs in a separate interpreter (``pypi_client_checks.py``), whose venv this
module makes on first use (``pip install dicomweb-client==PYPI_CLIENT_VERSION``, cached
in ~/.cache) unless DICOMWEB_PYPI_CLIENT_PYTHON names one. One test per check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import venv
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset

from tests.helpers import LiveServer, sample_files

from . import pypi_client_checks
from .conftest import require, store
from .studies import make_study, to_bytes

PYPI_CLIENT_VERSION = "0.61.2"
HERE = Path(__file__).parent
SIZE = 64
SLICES = 4
SAMPLES = {  # pydicom's own test files, stored as they are
    "jpeg_baseline": "SC_rgb_jpeg_dcmtk.dcm",
    "jpeg_multiframe": "examples_ybr_color.dcm",
    "jpeg2000": "examples_jpeg2k.dcm",
}


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dicomweb-archive"


def _clean_env() -> dict[str, str]:
    """The environment for the PyPI client's interpreter: without PYTHONPATH/PYTHONHOME,
    which would make it import this repository's ``dicomweb_client`` instead."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _client_version(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('dicomweb-client'))"],
                             capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir(),
                             env=_clean_env())
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@pytest.fixture(scope="module")
def client_python() -> str:
    given = os.environ.get("DICOMWEB_PYPI_CLIENT_PYTHON")
    if given:
        require(_client_version(given) is not None, f"dicomweb-client in {given}",
                f"{given} -m pip install dicomweb-client=={PYPI_CLIENT_VERSION}")
        return given
    env = _cache_dir() / f"pypi-dicomweb-client-{PYPI_CLIENT_VERSION}"
    python = str(env / "bin" / "python")
    if _client_version(python) != PYPI_CLIENT_VERSION:
        shutil.rmtree(env, ignore_errors=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(env)
        r = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            f"dicomweb-client=={PYPI_CLIENT_VERSION}"], capture_output=True, text=True)
        require(r.returncode == 0, f"dicomweb-client=={PYPI_CLIENT_VERSION} (PyPI)",
                f"pip could not install it into {env}: {r.stderr[-800:]}")
    return python


def _icon(ds: Dataset) -> None:
    """An IconImageSequence: its Pixel Data (4096 bytes) becomes a nested BulkDataURI."""
    import numpy as np

    icon = Dataset()
    icon.Rows = icon.Columns = 64
    icon.SamplesPerPixel, icon.PhotometricInterpretation = 1, "MONOCHROME2"
    icon.BitsAllocated, icon.BitsStored, icon.HighBit, icon.PixelRepresentation = 8, 8, 7, 0
    icon.PixelData = (np.arange(64 * 64) % 251).astype(np.uint8).tobytes()
    ds.IconImageSequence = [icon]


def _describe(ds: Dataset, path: Path) -> dict:
    return {"study": str(ds.StudyInstanceUID), "series": str(ds.SeriesInstanceUID), "sop": str(ds.SOPInstanceUID),
            "path": str(path), "rows": int(ds.Rows), "columns": int(ds.Columns),
            "samples": int(ds.SamplesPerPixel), "frames": int(getattr(ds, "NumberOfFrames", 1) or 1)}


@pytest.fixture(scope="module")
def results(client_python, tmp_path_factory, artifacts) -> dict:
    tmp = tmp_path_factory.mktemp("pypi-client")
    server = LiveServer(tmp / "data", "sqlite")
    # The PyPI client sends "Host: 127.0.0.1" without the port (dicomweb_client/web.py, _http_get
    # and _http_post set Host to the bare host name): an archive that builds RetrieveURL and
    # BulkDataURI from the Host header would name port 80. --public-url is the archive's answer.
    server.settings.public_url = server.url
    server.start()
    try:
        datasets = make_study(slices=SLICES, size=SIZE)
        _icon(datasets[0])
        instances = []
        for n, ds in enumerate(datasets):
            path = tmp / f"study-{n}.dcm"
            path.write_bytes(to_bytes(ds))
            instances.append(_describe(ds, path))
        store(server.url, datasets)
        by_name = {p.name: p for p in sample_files().values()}
        samples = {}
        for key, name in SAMPLES.items():
            ds = pydicom.dcmread(by_name[name])
            samples[key] = _describe(ds, by_name[name])
            store(server.url, [ds])
        # a second study, to page through
        store(server.url, make_study(slices=1, size=16, patient="Other^Patient", patient_id="OTHER"))
        to_store = []
        for n, ds in enumerate(make_study(slices=2, size=16, patient="Stored^ByClient", patient_id="STOW")):
            to_store.append(str(tmp / f"store-{n}.dcm"))
            Path(to_store[-1]).write_bytes(to_bytes(ds))
        to_delete = []
        for n, ds in enumerate(make_study(slices=2, size=16, patient="Deleted^ByClient", patient_id="DEL")):
            to_delete.append(str(tmp / f"delete-{n}.dcm"))
            Path(to_delete[-1]).write_bytes(to_bytes(ds))
        first = datasets[0]
        ctx = {
            "url": server.url, "size": SIZE, "instances": instances, "samples": samples,
            "study": {"uid": str(first.StudyInstanceUID), "patient_id": str(first.PatientID),
                      "ct_series": instances[0]["series"], "mr_series": instances[-1]["series"],
                      "instances": len(datasets)},
            "total_studies": 2 + len(SAMPLES), "to_store": to_store, "to_delete": to_delete,
        }
        (tmp / "context.json").write_text(json.dumps(ctx))
        env = _clean_env()
        r = subprocess.run([client_python, str(HERE / "pypi_client_checks.py"), str(tmp / "context.json"),
                            str(tmp / "results.json")], capture_output=True, text=True, timeout=300,
                           cwd=tmp, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads((tmp / "results.json").read_text())
        (artifacts / "pypi-dicomweb-client-results.json").write_text(json.dumps(out, indent=1))
        return out
    finally:
        server.stop()


def test_runs_the_pypi_package_not_ours(client_python):
    code = "import dicomweb_client, importlib.metadata as m; print(dicomweb_client.__file__, m.version('dicomweb-client'))"
    out = subprocess.run([client_python, "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir(),
                         env=_clean_env()).stdout
    assert PYPI_CLIENT_VERSION in out and str(Path(__file__).parents[2] / "dicomweb_client") not in out, out


@pytest.mark.parametrize("name", list(pypi_client_checks.CHECKS))
def test_pypi_client_call(results, name):
    outcome = results[name]
    assert outcome["ok"], outcome["error"]
