"""Peers for the client's peer suite: our archive and Orthanc with its DICOMweb plugin.

Both are started by the tests on free loopback ports, from this repository
(uvicorn in a thread) and from Debian's packages (``orthanc``,
``orthanc-dicomweb``: no Docker), each with its storage in a temp folder,
and loaded with the same data (made with pydicom, plus pydicom's bundled
``MR_small.dcm`` that the client README's example reads).

A third, read-only peer is a static DICOMweb tree served by Debian's nginx
(``static_tree.py``). A missing Orthanc or nginx FAILS the suite with the
install command; set ``DICOMWEB_PEERS=skip`` to skip on purpose instead.
"""
from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pydicom
import pytest
from pydicom.data import get_testdata_file

from dicomweb_client import DICOMwebClient
from tests.helpers import LiveServer, free_port, make_dataset

from .processes import PeerProcess

ORTHANC_BINARY = "/usr/sbin/Orthanc"
PLUGIN_CANDIDATES = (
    "/usr/share/orthanc/plugins/libOrthancDicomWeb.so",
    "/usr/lib/orthanc/libOrthancDicomWeb.so",
)


def _missing(message: str, packages: str = "orthanc orthanc-dicomweb") -> None:
    if os.environ.get("DICOMWEB_PEERS", "").lower() == "skip":
        pytest.skip(message)
    pytest.fail(f"{message}; install it with: sudo apt-get install -y {packages}"
                "  (or set DICOMWEB_PEERS=skip to skip the peer tests)", pytrace=False)


def orthanc_paths() -> tuple[str, str]:
    """The Orthanc binary and the DICOMweb plugin, or fail with the install command."""
    binary = ORTHANC_BINARY if os.access(ORTHANC_BINARY, os.X_OK) else shutil.which("Orthanc")
    if not binary:
        _missing("Orthanc is not installed (Debian package orthanc)")
    plugin = next((p for p in PLUGIN_CANDIDATES if os.path.exists(p)), None)
    if plugin is None:
        _missing("Orthanc's DICOMweb plugin is not installed (Debian package orthanc-dicomweb)")
    return binary, plugin


class Orthanc(PeerProcess):
    """One Orthanc process on 127.0.0.1: DICOM port off (unless ``config`` turns it on), no remote
    access, no authentication."""

    name = "Orthanc"

    def __init__(self, folder: Path, **config) -> None:
        self.binary, self.plugin = orthanc_paths()
        self.config = config  # more of Orthanc's settings, e.g. its DICOM port (tests/dimse/test_pull.py)
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/dicom-web"
        self.log = folder / "orthanc.log"

    def start(self) -> Orthanc:
        config = {
            "Name": "peer-test",
            "StorageDirectory": str(self.folder / "storage"),
            "IndexDirectory": str(self.folder / "storage"),
            "HttpPort": self.port,
            "DicomServerEnabled": False,
            "RemoteAccessAllowed": False,
            "AuthenticationEnabled": False,
            "HttpCompressionEnabled": False,
            "Plugins": [self.plugin],
            "DicomWeb": {"Enable": True, "Root": "/dicom-web/"},
            **self.config,
        }
        cfg = self.folder / "orthanc.json"
        cfg.write_text(json.dumps(config))
        self.spawn([self.binary, str(cfg)], self.folder, f"{self.url}/studies")
        return self


@dataclass
class Data:
    """The same instances stored in every peer."""

    multiframe: object = field(default_factory=lambda: make_dataset(
        frames=3, rows=4, columns=6, PatientID="PEER1", PatientName="Peer^Multi", StudyDescription="peer study",
        AccessionNumber="A1"))
    second: object = None
    other_study: object = None

    def __post_init__(self) -> None:
        m = self.multiframe
        self.second = make_dataset(study=m.StudyInstanceUID, series=m.SeriesInstanceUID, PatientID="PEER1",
                                   PatientName="Peer^Multi", StudyDescription="peer study")
        self.other_study = make_dataset(PatientID="PEER2", modality="MR")

    @property
    def all(self) -> list:
        return [self.multiframe, self.second, self.other_study]


@dataclass
class Peer:
    name: str
    url: str


DATA = Data()
MR_SMALL = get_testdata_file("MR_small.dcm")


def _load(url: str) -> None:
    with DICOMwebClient(url) as client:
        result = client.store_instances([*DATA.all, MR_SMALL])
        assert result.ok and len(result.referenced) == 4, result


@contextmanager
def _serving(server, name: str, load: bool = True):
    """``Peer(name, server.url)`` (loaded with ``DATA`` unless read-only); stops the server at the end."""
    try:
        if load:
            _load(server.url)
        yield Peer(name, server.url)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def orthanc_peer(tmp_path_factory):
    with _serving(Orthanc(tmp_path_factory.mktemp("orthanc")).start(), "orthanc") as peer:
        yield peer


@pytest.fixture(scope="session")
def ours_peer(tmp_path_factory):
    with _serving(LiveServer(tmp_path_factory.mktemp("archive"), "sqlite").start(), "ours") as peer:
        yield peer


@pytest.fixture(scope="session")
def static_peer(tmp_path_factory):
    from .static_tree import StaticPeer, nginx_path

    if nginx_path() is None:
        _missing("nginx is not installed (Debian package nginx-light)", "nginx-light")
    server = StaticPeer(tmp_path_factory.mktemp("static"), [*DATA.all, pydicom.dcmread(MR_SMALL)])
    with _serving(server.start(), "static", load=False) as peer:
        yield peer


@pytest.fixture(params=["ours", "orthanc"])
def peer(request) -> Peer:
    """A peer that stores: our archive or Orthanc."""
    return request.getfixturevalue(f"{request.param}_peer")


@pytest.fixture(params=["ours", "orthanc", "static"])
def any_peer(request) -> Peer:
    """Any peer, the read-only static tree included."""
    return request.getfixturevalue(f"{request.param}_peer")
