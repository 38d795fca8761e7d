"""The index interface: what the archive needs from a metadata index, whatever
keeps it (Python structures or SQLite). One contract test suite runs against
every implementation (tests/store/test_index_contract.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..dicom.instance import InstanceRecord
from ..dicom.matching import Query


@dataclass(frozen=True, slots=True)
class InstanceLocation:
    """Where an instance lives and how to read its pixels."""

    study_uid: str
    series_uid: str
    sop_uid: str
    sop_class_uid: str
    transfer_syntax_uid: str
    path: str  # relative to the blob root
    size: int
    pixel: dict | None  # see dicom.instance.InstanceRecord.pixel


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One QIDO-RS match: the stored JSON of its levels and the computed attributes.

    ``study_json``/``series_json``/``instance_json`` are DICOM JSON objects as
    bytes (``series_json`` None for study searches, ``instance_json`` None above
    the instance level); ``computed`` maps keyword -> value for
    ModalitiesInStudy, SOPClassesInStudy, NumberOfStudyRelatedSeries,
    NumberOfStudyRelatedInstances, NumberOfSeriesRelatedInstances (those that apply).
    """

    study_uid: str
    series_uid: str | None
    sop_uid: str | None
    study_json: bytes
    series_json: bytes | None
    instance_json: bytes | None
    computed: dict[str, object]


class Index(ABC):
    """Metadata index of the archive. Implementations are safe to call from
    worker threads; ``add`` and ``delete`` are durable when they return."""

    @abstractmethod
    def add(self, records: list[InstanceRecord]) -> list[bool]:
        """Index new instances in one durable commit. Returns, per record, True
        when it was added and False when that SOP Instance UID was already indexed
        (the existing row is kept unchanged)."""

    @abstractmethod
    def locate(self, sop_uid: str) -> InstanceLocation | None:
        """The instance with this SOP Instance UID, or None."""

    @abstractmethod
    def instances(self, study_uid: str, series_uid: str | None = None) -> list[InstanceLocation]:
        """Instances of a study (or one of its series) in a stable order:
        series in arrival order, then instances in arrival order."""

    @abstractmethod
    def metadata(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None
                 ) -> list[bytes]:
        """Stored DICOM JSON of the instances of a study, series or one instance
        (empty list when nothing matches), in the order of :meth:`instances`."""

    @abstractmethod
    def search(self, query: Query) -> list[SearchHit]:
        """QIDO-RS matches of ``query`` in a stable order (arrival order of the
        entity searched), after ``offset``, at most ``limit`` (PS3.18 §10.6)."""

    @abstractmethod
    def delete(self, study_uid: str, series_uid: str | None = None, sop_uid: str | None = None
               ) -> list[str]:
        """Remove the rows of a study, series or instance in one durable commit;
        returns the relative paths of the files the caller must now remove."""

    @abstractmethod
    def count(self) -> int:
        """Number of indexed instances."""

    @abstractmethod
    def paths(self) -> Iterator[tuple[str, str]]:
        """(sop_uid, relative path) of every indexed instance (for ``check``)."""

    def close(self) -> None:  # pragma: no cover - default no-op
        """Release resources."""

    # --- write hooks (routing's outbox) -------------------------------------------------

    def add_write_hook(self, hook: "WriteHook") -> None:
        """Run ``hook(con, records, added)`` inside every :meth:`add`, before it
        commits: ``con`` is the open SQLite transaction of the index (None for an
        index without one), ``added`` says which records are new. An exception
        from the hook fails (rolls back) the whole add."""
        self._write_hooks = (*getattr(self, "_write_hooks", ()), hook)

    def _run_write_hooks(self, con: object, records: list[InstanceRecord], added: list[bool]) -> None:
        for hook in getattr(self, "_write_hooks", ()):
            hook(con, records, added)


WriteHook = Callable[[object, list[InstanceRecord], list[bool]], None]
