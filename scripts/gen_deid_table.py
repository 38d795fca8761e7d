"""Generate dicomweb_server/deid/table_e1_1.json, the data of PS3.15 Table E.1-1
(Application Level Confidentiality Profile Attributes), from a machine-readable copy of
the standard.

Source used: ``standard/confidentiality_profile_attributes.json`` of the
innolitics/dicom-standard repository at its "Update standard to rev2024b" commit
(8670abdd9ad16c61af5146ef857899699bdd9c5f), parsed by that project from the DocBook of
DICOM PS3.15 2024b. Usage::

    python scripts/gen_deid_table.py confidentiality_profile_attributes.json

Check done when generated (tests/deid/test_profile.py keeps the counts): the Basic
Profile column of all 617 fixed tags equals the independent hand-kept transcription of
the same edition in the PyPI package dicom-anonymizer 2.1.0
(``dicomanonymizer/dicom_anonymization_databases/dicomfields_2024b.py``); the
repeating groups (50xx,xxxx), (60xx,3000), (60xx,4000) and the private attributes row
agree too (that package keeps them as masks and a separate rule).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EDITION = "2024b"
#: the source's column keys -> the option names of dicomweb_server/deid/profile.py
COLUMNS = {
    "rtnSafePrivOpt": "retain_safe_private",
    "rtnUIDsOpt": "retain_uids",
    "rtnDevIdOpt": "retain_device_identity",
    "rtnInstIdOpt": "retain_institution_identity",
    "rtnPatCharsOpt": "retain_patient_characteristics",
    "rtnLongFullDatesOpt": "retain_full_dates",
    "rtnLongModifDatesOpt": "retain_modified_dates",
    "cleanDescOpt": "clean_descriptors",
    "cleanStructContOpt": "clean_structured_content",
    "cleanGraphOpt": "clean_graphics",
}


def rows(source: list[dict]) -> list[list]:
    out = []
    for r in source:
        tag = r["tag"]
        if "ODD" in tag.upper():
            tag = "private"
        else:
            tag = tag.strip("()").replace(",", "").upper()  # "0008,0050" -> "00080050"; 50XXXXXX kept
        options = {COLUMNS[k]: v for k, v in r.items() if k in COLUMNS}
        out.append([tag, r["name"], r["basicProfile"], options])
    out.sort(key=lambda row: row[0])
    return out


def main(argv: list[str]) -> int:
    source = json.loads(Path(argv[1]).read_text())
    table = rows(source)
    target = Path(__file__).resolve().parent.parent / "dicomweb_server" / "deid" / "table_e1_1.json"
    lines = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in table]
    target.write_text('{"edition":"%s","source":"DICOM PS3.15 %s Table E.1-1","rows":[\n%s\n]}\n'
                      % (EDITION, EDITION, ",\n".join(lines)))
    print(f"{len(table)} rows -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
