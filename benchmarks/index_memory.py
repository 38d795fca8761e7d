"""Bytes per instance held by the in-memory index (tracemalloc: everything the
index references), for realistic CT headers: N instances in studies of 25
instances over 5 series, each from one of 4 sources (a new string object per
instance, as the front doors make them: archive.py source_of_dimse). Usage:
python benchmarks/index_memory.py [N]"""

from __future__ import annotations

import gc
import os
import pathlib
import sys
import tempfile
import tracemalloc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from pydicom.uid import generate_uid  # noqa: E402

from dicomweb_server.dicom.instance import describe_instance  # noqa: E402
from dicomweb_server.store.memory import MemoryIndex  # noqa: E402
from tests.helpers import make_dataset  # noqa: E402


def main(n: int) -> None:
    folder = tempfile.mkdtemp()
    studies = [generate_uid() for _ in range(max(1, n // 25))]
    series = {s: [generate_uid() for _ in range(5)] for s in studies}
    paths = []
    for k in range(n):
        s = studies[k % len(studies)]
        ds = make_dataset(
            # (one patient per study: an instance of another patient's study is refused, not indexed)
            study=s, series=series[s][k % 5], rows=2, columns=2, PatientID=f"PAT{studies.index(s) % 400:04d}",
            PatientName=f"Doe^John{studies.index(s) % 400}", StudyDescription="CT CHEST WITH CONTRAST",
            SeriesDescription="AXIAL 5mm", InstanceNumber=k, WindowCenter="40", WindowWidth="400",
            RescaleIntercept="-1024", RescaleSlope="1", SliceThickness="5.0", PixelSpacing=["0.7", "0.7"],
            ImagePositionPatient=["-150", "-150", str(k)], ImageOrientationPatient=["1", "0", "0", "0", "1", "0"],
            Manufacturer="ACME", InstitutionName="General Hospital", KVP="120", AccessionNumber=f"ACC{k % 400}",
            StudyID="1", SeriesNumber=str(k % 5), AcquisitionNumber="1", ImageType=["ORIGINAL", "PRIMARY", "AXIAL"],
            StudyTime="101010", ReferringPhysicianName="Ref^Doc", PatientBirthDate="19700101", PatientSex="M",
        )
        path = pathlib.Path(folder) / f"{k}.dcm"
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    gc.collect()
    tracemalloc.start()
    index = MemoryIndex()
    for i in range(0, n, 100):
        records = [describe_instance(p) for p in paths[i : i + 100]]
        for k, r in enumerate(records, start=i):
            if hasattr(r, "source"):  # (an archive that keeps sources)
                r.source = "".join(["dimse:", f"MODALITY{k % 4}"])  # a new string each time
        index.add(records)
    gc.collect()
    current, _peak = tracemalloc.get_traced_memory()
    assert index.count() == n, index.count()
    print(f"| {n} | {index.count()} | {current / n:.0f} |")
    for p in paths:
        os.unlink(p)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
