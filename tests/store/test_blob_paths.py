"""Stored paths resolve inside the blob folder only, as a Path (resolve) or a str
(resolve_str, the whole-study answer's cheaper form), with the same refusals."""

from __future__ import annotations

import os

import pytest

from dicomweb_server.store.blobs import BlobStore


@pytest.mark.parametrize("rel", ["1.2/3.4/5.6.dcm", "a/./b/../c.dcm", "misc/x.dcm"])
def test_both_forms_name_the_same_file(tmp_path, rel):
    blobs = BlobStore(tmp_path)
    assert blobs.resolve_str(rel) == str(blobs.resolve(rel))
    assert blobs.resolve_str(rel).startswith(str(blobs.blobs.resolve()) + os.sep)


@pytest.mark.parametrize("rel", ["../x.dcm", "a/../../x.dcm", "/etc/passwd", "..", "a/\0b"])
def test_both_forms_refuse_what_leaves_the_folder(tmp_path, rel):
    blobs = BlobStore(tmp_path)
    for resolve in (blobs.resolve, blobs.resolve_str):
        with pytest.raises(ValueError, match="outside the archive"):
            resolve(rel)
