"""What creating one file costs in a folder where many files were just deleted.

Every stored instance is a new file (a new inode). On ext4 *without a journal* the
kernel's inode allocator skips inodes of the block group deleted in the last minutes
(``find_inode_bit`` -> ``recently_deleted``: 60 s, 360 s while the inode table block is
dirty), looking each one up on the way; with thousands of them, creating a file costs
hundreds of microseconds of CPU instead of ~20. A benchmark that deletes a step's
instances and then stores again measures that, not the server (loadtests/capacity.py and
loadtests/load01.py remove what they stored after their last step for this reason).

    python benchmarks/file_create.py [--folder DIR] [--delete 6000] [--files 300]
        [--after 0,10,40,70,130,400] [--output FILE.md]

In a new folder under DIR (default: the temporary folder): ``--files`` empty files
created (CPU per file), then ``--delete`` files created and deleted in the same folder,
then ``--files`` new ones at each of ``--after`` seconds after the deletion (the first
right after it, then after ``sync``). CPU is this process's (user + system).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time


def create(folder: pathlib.Path, prefix: str, n: int) -> float:
    """Microseconds of CPU per file to create ``n`` empty files."""
    t = time.process_time()
    for i in range(n):
        os.close(os.open(folder / f"{prefix}{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return (time.process_time() - t) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()))
    p.add_argument("--delete", type=int, default=6000)
    p.add_argument("--files", type=int, default=300)
    p.add_argument("--after", default="0,10,40,70,130,400")
    p.add_argument("--output", type=pathlib.Path)
    a = p.parse_args()
    folder = pathlib.Path(tempfile.mkdtemp(prefix="file-create-", dir=a.folder))
    rows = [("before any deletion", create(folder, "a", a.files))]
    print(f"{rows[-1][0]}: {rows[-1][1]:.0f} us", flush=True)
    for i in range(a.delete):
        os.close(os.open(folder / f"d{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    for i in range(a.delete):
        os.unlink(folder / f"d{i}")
    t0 = time.monotonic()
    for k, at in enumerate(float(x) for x in a.after.split(",")):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        rows.append((f"{at:g} s after deleting {a.delete}", create(folder, f"c{k}-", a.files)))
        print(f"{rows[-1][0]}: {rows[-1][1]:.0f} us", flush=True)
        if k == 0:
            os.sync()
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    text = "\n".join(["| when | CPU per file created (us) |", "|---|---|",
                      *(f"| {w} | {us:.0f} |" for w, us in rows)]) + "\n"
    print(text)
    if a.output:
        a.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
