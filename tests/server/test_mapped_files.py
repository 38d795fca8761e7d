"""Whole-study answers send views of mapped files (retrieve.map_files). A map of a
file cut short underneath raises SIGBUS only when user space touches a page past the
new end; the archive only lets the kernel read these pages (MADV_POPULATE_READ in
retrieve.populate, the socket's writev), where the same fault is an EFAULT error.
Run in a child process: a SIGBUS would kill it, not the test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest

from dicomweb_server import retrieve

CHILD = textwrap.dedent("""
    import errno, os, socket, sys, tempfile, types
    from dicomweb_server import retrieve

    size = 1 << 20
    path = os.path.join(tempfile.mkdtemp(), "f.dcm")
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    loc = types.SimpleNamespace(size=size, sop_uid="1.2.3")
    ((_, m),) = retrieve.map_files([(path, loc)])
    os.truncate(path, 0)  # by hand, under the map (the archive never does)
    out = []
    try:
        retrieve.populate([(m, 0, size)])
        out.append("populate ok")
    except OSError as e:
        out.append("populate " + errno.errorcode[e.errno])
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        a.send(memoryview(m)[:65536])
        out.append("send ok")
    except OSError as e:
        out.append("send " + errno.errorcode[e.errno])
    print(" ".join(out))
""")


def test_a_mapped_file_truncated_underneath_is_an_error_not_sigbus():
    r = subprocess.run([sys.executable, "-c", CHILD], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)  # -7 would be SIGBUS
    assert r.stdout.split() == ["populate", "EFAULT", "send", "EFAULT"]


def test_maps_are_the_stored_bytes_and_skip_gone_or_replaced_files(tmp_path):
    data = bytes(range(256)) * 4096 + b"end"  # 1 MiB + 3 bytes: a partial last page
    paths = []
    for name, content in (("a", data), ("b", b""), ("c", data[:100])):
        p = tmp_path / name
        p.write_bytes(content)
        paths.append(p)
    locs = [types.SimpleNamespace(size=len(data), sop_uid="a"), types.SimpleNamespace(size=0, sop_uid="b"),
            types.SimpleNamespace(size=999, sop_uid="c"),  # replaced: another size than the row
            types.SimpleNamespace(size=5, sop_uid="d")]  # gone
    out = retrieve.map_files(list(zip(paths + [tmp_path / "missing"], locs)))
    assert [loc.sop_uid for loc, _ in out] == ["a", "b"]
    (_, m), (_, empty) = out
    assert empty is None
    retrieve.populate([(m, 5000, len(data))])  # an unaligned start is aligned down to its page
    assert bytes(memoryview(m)) == data
    m.close()


def test_out_of_descriptors_while_mapping_closes_the_maps_made(tmp_path, monkeypatch):
    import errno
    import mmap

    for name in "ab":
        (tmp_path / name).write_bytes(b"x" * 10)
    made, real = [], mmap.mmap

    def mmap_until_full(*a, **k):
        if made:
            raise OSError(errno.EMFILE, "Too many open files")
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(retrieve.mmap, "mmap", mmap_until_full)
    locs = [types.SimpleNamespace(size=10, sop_uid=n) for n in "ab"]
    with pytest.raises(retrieve.OutOfDescriptors):
        retrieve.map_files([(tmp_path / "a", locs[0]), (tmp_path / "b", locs[1])])
    assert made[0].closed
