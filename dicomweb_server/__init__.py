"""dicomweb-archive: a DICOMweb (PS3.18) archive with an in-memory or SQLite index."""

__version__ = "0.1.0"
