"""Background jobs: long work (de-identify a selection, recompress what is stored, pull
studies from another PACS) that survives a restart and reports its progress.

A job is a *handler* (a plain function of a :class:`Context`) plus its parameters. The
handler walks its items in a stable order and calls :meth:`Context.save` every few items
with a *checkpoint* (a small JSON-able dict saying where it is) and its counts; ``save``
makes both durable. After a crash or a restart the job runs again from its last checkpoint
(``ctx.checkpoint``), so the work done after that save is done twice: each item's effect
must be idempotent (the same output UID, file name or object key, or a check that it is
already there), which is what "resumable without duplicates" rests on.

Who runs a job:

- the command line (``dicomweb-server recompress``, ``pull``, ``export --deidentify``) with
  :class:`InlineContext`: in the process, the checkpoint in a JSON file given by the
  command (``--resume FILE``) or nowhere;
- the archive (``POST /studies/{study}/$deidentify``, ``POST /admin/jobs``...) with the
  durable runner (jobs/runner.py): the job is a row of the routing outbox (routing/outbox.py,
  destination ``job:<kind>``), so its lease, retries and dead letter are the outbox's; its
  checkpoint and progress are in the ``jobs`` table beside it; ``GET /jobs/{id}`` reads them.

A handler never sleeps in a loop waiting for work and never catches :class:`JobStopped`.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

#: kind -> "module:function" of its handler (imported when first run: no import cycles)
KINDS: dict[str, str] = {
    "deidentify": "dicomweb_server.deid.job:run",
    "recompress": "dicomweb_server.policy.recompress:run",
    "pull": "dicomweb_server.dimse.pull:run",
}


class JobStopped(Exception):  # noqa: N818 - a signal, not an error
    """Raised by :meth:`Context.save` when the job must stop now (cancelled, or the process
    is shutting down); the handler lets it through. A cancelled job ends ``cancelled``; a
    stopped one runs again later from the checkpoint just saved."""


class JobError(Exception):
    """A job that cannot run at all (bad parameters, a target that does not exist): it ends
    ``failed`` with this message, without retries."""


@dataclass(slots=True)
class Progress:
    """A job's counts, as ``GET /jobs/{id}`` shows them: ``total`` is None until known."""

    total: int | None = None
    done: int = 0
    failed: int = 0
    skipped: int = 0
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. bytes_before/bytes_after

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "done": self.done, "failed": self.failed, "skipped": self.skipped,
                **({"detail": self.detail} if self.detail else {})}


class Context(ABC):
    """What a handler gets: its parameters, its last checkpoint, the archive, and ``save``."""

    def __init__(self, job_id: str, kind: str, params: dict, checkpoint: dict | None, archive,
                 progress: Progress | None = None) -> None:
        self.id = job_id
        self.kind = kind
        self.params = params
        self.checkpoint: dict = dict(checkpoint or {})
        self.archive = archive  # archive.Archive (settings: archive.settings)
        self.progress = progress or Progress()

    def save(self, checkpoint: dict, *, total: int | None = None, done: int | None = None,
             failed: int | None = None, skipped: int | None = None, detail: dict | None = None) -> None:
        """Make ``checkpoint`` and the counts given durable, then raise :class:`JobStopped`
        if the job must stop. Counts are absolute values (not increments)."""
        p = self.progress
        if total is not None:
            p.total = total
        if done is not None:
            p.done = done
        if failed is not None:
            p.failed = failed
        if skipped is not None:
            p.skipped = skipped
        if detail is not None:
            p.detail = detail
        self.checkpoint = dict(checkpoint)
        self._persist()
        if self.stopping():
            raise JobStopped(self.id)

    @abstractmethod
    def _persist(self) -> None:
        """Write ``self.checkpoint`` and ``self.progress`` durably."""

    def stopping(self) -> bool:
        """Whether the job should stop at its next save (cancelled, shutting down)."""
        return False


class InlineContext(Context):
    """A job run by the command line in its own process: the checkpoint in ``resume_file``
    (JSON, replaced atomically and fsynced at each save) when one is given, so the same
    command with the same file continues where a killed run stopped; ``on_progress`` sees
    the counts after each save (a progress bar)."""

    def __init__(self, kind: str, params: dict, archive, resume_file: Path | None = None,
                 on_progress: Callable[[Progress], None] | None = None) -> None:
        checkpoint: dict = {}
        progress = Progress()
        self.resume_file = resume_file
        if resume_file is not None and resume_file.exists():
            saved = orjson.loads(resume_file.read_bytes())
            if saved.get("kind") != kind or saved.get("params") != params:
                raise JobError(f"{resume_file} holds another job ({saved.get('kind')}, other parameters)")
            checkpoint = saved.get("checkpoint") or {}
            p = saved.get("progress") or {}
            progress = Progress(p.get("total"), p.get("done", 0), p.get("failed", 0), p.get("skipped", 0),
                                p.get("detail") or {})
        super().__init__("inline", kind, params, checkpoint, archive, progress)
        self.on_progress = on_progress

    def _persist(self) -> None:
        if self.resume_file is not None:
            body = orjson.dumps({"kind": self.kind, "params": self.params, "checkpoint": self.checkpoint,
                                 "progress": self.progress.as_dict()})
            folder = self.resume_file.parent
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".job-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.resume_file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        if self.on_progress is not None:
            self.on_progress(self.progress)


def handler(kind: str) -> Callable[[Context], dict]:
    """The handler function of ``kind`` (:data:`KINDS`); KeyError for an unknown kind."""
    module, _, name = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def run_inline(kind: str, params: dict, archive, resume_file: Path | None = None,
               on_progress: Callable[[Progress], None] | None = None) -> tuple[dict, Progress]:
    """Run a job to its end in this process (the command line): its result and counts."""
    ctx = InlineContext(kind, params, archive, resume_file, on_progress)
    result = handler(kind)(ctx)
    return result, ctx.progress
