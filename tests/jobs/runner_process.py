"""A process running a job runner on an archive until killed (tests/jobs/test_runner.py:
SIGKILL mid-job). Usage: python -m tests.jobs.runner_process DATA INDEX [DATABASE_URL]"""

from __future__ import annotations

import sys
import threading

from dicomweb_server import jobs
from dicomweb_server.archive import Archive
from dicomweb_server.jobs.runner import Runner
from dicomweb_server.routing import open_outbox
from dicomweb_server.settings import Settings

jobs.KINDS["count"] = "tests.jobs.kinds:count"

if __name__ == "__main__":
    data, index = sys.argv[1], sys.argv[2]
    extra = {"database_url": sys.argv[3]} if len(sys.argv) > 3 else {}
    settings = Settings(data_dir=data, index=index, **extra)
    archive = Archive.open(settings)
    runner = Runner(archive, open_outbox(settings, archive.committer.writer), lease=30, retry=0.1, poll=0.1)
    runner.start()
    print("ready", flush=True)
    threading.Event().wait()
