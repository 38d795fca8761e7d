"""A read-only DICOMweb peer: a static file tree served by Debian's nginx.

The tree holds, for each resource URL, one file ``_.json`` (DICOM JSON),
``_.dcm`` (``multipart/related; type="application/dicom"``) or ``_.bin``
(``multipart/related; type="application/octet-stream"``); nginx picks the
Content-Type from the extension. It ignores query strings (a search returns
everything), Accept (one representation each), frame lists (one frame per
request) and refuses every method but GET with 405. It has no rendered or
thumbnail resources.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

from pydicom.dataset import Dataset

from tests.helpers import free_port, multipart, to_bytes

from .processes import PeerProcess

BOUNDARY = "static-peer-boundary"
NGINX = "/usr/sbin/nginx"


def _put(root: Path, url_path: str, name: str, data: bytes) -> None:
    folder = root / url_path.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def _json(root: Path, url_path: str, doc) -> None:
    _put(root, url_path, "_.json", json.dumps(doc).encode())


def _instances(root: Path, url_path: str, datasets) -> None:
    body, _ = multipart([to_bytes(ds) for ds in datasets], BOUNDARY)
    _put(root, url_path, "_.dcm", body)


def _octets(root: Path, url_path: str, data: bytes) -> None:
    body, _ = multipart([("application/octet-stream", data)], BOUNDARY)
    _put(root, url_path, "_.bin", body)


def _attrs(ds, keywords) -> dict:
    """The DICOM JSON of ``ds``'s attributes ``keywords`` (a QIDO-RS result)."""
    sub = Dataset()
    for keyword in keywords:
        if keyword in ds:
            sub[keyword] = ds[keyword]
    return sub.to_json_dict()


def write_tree(root: Path, base_url: str, datasets) -> None:
    """The DICOMweb resources of ``datasets`` under ``root`` (URLs in metadata name ``base_url``)."""
    studies: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for ds in datasets:
        studies[str(ds.StudyInstanceUID)][str(ds.SeriesInstanceUID)].append(ds)
    study_results = []
    for s, series in studies.items():
        members = [ds for group in series.values() for ds in group]
        first = members[0]
        result = _attrs(first, ["StudyInstanceUID", "PatientID", "PatientName", "StudyDate", "StudyDescription"])
        result["00080061"] = {"vr": "CS", "Value": sorted({str(ds.Modality) for ds in members})}
        result["00201206"] = {"vr": "IS", "Value": [len(series)]}
        result["00201208"] = {"vr": "IS", "Value": [len(members)]}
        study_results.append(result)
        _instances(root, f"studies/{s}", members)
        series_results, study_meta = [], []
        for se, group in series.items():
            result = _attrs(group[0], ["SeriesInstanceUID", "Modality", "SeriesNumber"])
            result["00201209"] = {"vr": "IS", "Value": [len(group)]}
            series_results.append(result)
            _instances(root, f"studies/{s}/series/{se}", group)
            instance_results, series_meta = [], []
            for ds in group:
                url = f"studies/{s}/series/{se}/instances/{ds.SOPInstanceUID}"
                instance_results.append(_attrs(ds, ["SOPClassUID", "SOPInstanceUID", "Rows", "Columns", "NumberOfFrames"]))
                _instances(root, url, [ds])
                meta = ds.to_json_dict(bulk_data_threshold=64,
                                       bulk_data_element_handler=lambda e, u=url: f"{base_url}/{u}/bulk/{e.tag:08X}")
                _json(root, f"{url}/metadata", [meta])
                series_meta.append(meta)
                if "PixelData" in ds:
                    _octets(root, f"{url}/bulk/7FE00010", ds.PixelData)
                    size = ds.Rows * ds.Columns * ds.BitsAllocated // 8
                    for n in range(1, int(ds.get("NumberOfFrames", 1) or 1) + 1):
                        _octets(root, f"{url}/frames/{n}", ds.PixelData[(n - 1) * size : n * size])
            _json(root, f"studies/{s}/series/{se}/instances", instance_results)
            _json(root, f"studies/{s}/series/{se}/metadata", series_meta)
            study_meta += series_meta
        _json(root, f"studies/{s}/series", series_results)
        _json(root, f"studies/{s}/metadata", study_meta)
    _json(root, "studies", study_results)


def nginx_config(root: Path, folder: Path, port: int) -> str:
    user = "user root;\n" if os.geteuid() == 0 else ""  # the tree is in a private temp folder
    return f"""{user}daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    types {{
        application/dicom+json json;
        "multipart/related; type=\\"application/dicom\\"; boundary={BOUNDARY}" dcm;
        "multipart/related; type=\\"application/octet-stream\\"; boundary={BOUNDARY}" bin;
    }}
    server {{
        listen 127.0.0.1:{port};
        root {root};
        if ($request_method !~ ^(GET|HEAD)$) {{ return 405; }}
        location / {{ try_files $uri/_.json $uri/_.dcm $uri/_.bin =404; }}
    }}
}}
"""


def nginx_path() -> str | None:
    return NGINX if os.access(NGINX, os.X_OK) else shutil.which("nginx")


class StaticPeer(PeerProcess):
    """nginx serving a static DICOMweb tree on a free loopback port."""

    name = "nginx"

    def __init__(self, folder: Path, datasets) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = folder / "tree"
        self.log = folder / "error.log"
        write_tree(self.root, self.url, datasets)

    def start(self) -> StaticPeer:
        conf = self.folder / "nginx.conf"
        conf.write_text(nginx_config(self.root, self.folder, self.port))
        self.spawn([nginx_path(), "-p", str(self.folder), "-e", str(self.log), "-c", str(conf)], self.folder, f"{self.url}/studies")
        return self
