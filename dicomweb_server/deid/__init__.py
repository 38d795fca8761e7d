"""De-identification (DICOM PS3.15 Annex E): the Basic Application Level Confidentiality
Profile and its options as data (profile.py, table_e1_1.json), applied to a pydicom
Dataset (apply.py) with consistent UIDs (uids.py) and per-project pseudonyms
(pseudonyms.py). Plain modules: no FastAPI here."""
