"""Modality Performed Procedure Step SOP Class as SCP (PS3.4 Annex F): N-CREATE and
N-SET from a modality telling what it performed.

- N-CREATE (F.7.2.1): a new instance, status IN PROGRESS; the Affected SOP Instance UID is
  the modality's, or one the archive makes and returns in the N-CREATE-RSP (PS3.7
  10.1.5.1.4). The same UID again: 0x0111 Duplicate SOP instance.
- N-SET (F.7.2.2): its modification list applied while the step is IN PROGRESS; a step
  COMPLETED or DISCONTINUED is no longer updated (0x0110, Error ID 0xA710: Table F.7.2-2).
- What may be set when, and the statuses of a refusal: dicom/mpps.py.

Each accepted request is one durable commit of the index (store/mpps.py) before its
Success: the instance, the worklist entries its Scheduled Step Attributes Sequence names
marked STARTED / COMPLETED / DISCONTINUED (their Scheduled Procedure Step Status), and,
once COMPLETED, the instances its Performed Series Sequence lists kept as the modality's
declaration (store/arrivals.py; the operator's study page: arrived N of declared M).
Both services need the ``write`` scope of a peer (dimse/access.py), as C-STORE does.
"""

from __future__ import annotations

import logging
import time

from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from pynetdicom.sop_class import ModalityPerformedProcedureStep

from ..dicom.mpps import NO_SUCH_SOP_CLASS, PROCESSING_FAILURE, MppsError
from ..store.base import Index
from . import status as S

log = logging.getLogger("dicomweb_server.dimse")

SOP_CLASS = str(ModalityPerformedProcedureStep)  # 1.2.840.10008.3.1.2.3.3


def _refused(e: MppsError) -> Dataset:
    ds = S.dataset(e.status, str(e))
    if e.error_id is not None:
        ds.ErrorID = e.error_id  # (0000,0903)
    return ds


def _requester(event) -> str:
    ae = event.assoc.requestor.ae_title
    return (ae.decode("ascii", "replace") if isinstance(ae, bytes) else str(ae)).strip()


#: the request primitive's attribute of each data set (pynetdicom's event attribute decodes it
#: without bounds: a Deflated one inflated whole; find.py parsed_identifier has them)
_PRIMITIVE = {"attribute_list": "AttributeList", "modification_list": "ModificationList"}


def _decoded(event, name: str) -> dict:
    from .find import parsed_identifier

    try:
        raw = getattr(event.request, _PRIMITIVE[name])
        ds = parsed_identifier(raw, event.context.transfer_syntax) if raw is not None else None
        return ds.to_json_dict() if ds is not None else {}
    except Exception as e:  # noqa: BLE001 - does not decode
        raise MppsError(PROCESSING_FAILURE, f"the {name.replace('_', ' ')} cannot be decoded: {e}") from None


def on_n_create(index: Index, event):
    """``EVT_N_CREATE``: (status, attribute list) of the N-CREATE-RSP."""
    req = event.request
    try:
        if str(req.AffectedSOPClassUID) != SOP_CLASS:
            raise MppsError(NO_SUCH_SOP_CLASS, f"N-CREATE of SOP Class {req.AffectedSOPClassUID}")
        sop_uid = str(req.AffectedSOPInstanceUID or "").strip() or str(generate_uid())
        step = index.create_mpps(sop_uid, _requester(event), _decoded(event, "attribute_list"), time.time())
    except MppsError as e:
        log.warning("MPPS N-CREATE from %s refused: %s", _requester(event), e)
        return _refused(e), None
    except Exception as e:  # noqa: BLE001 - a failure status, never a dead association thread
        log.exception("MPPS N-CREATE failed")
        return S.dataset(PROCESSING_FAILURE, str(e)), None
    log.info("MPPS %s created by %s (%s; worklist %s)", sop_uid, _requester(event), step.status,
             ", ".join(step.sps_ids) or "-")
    rsp = None
    if req.AffectedSOPInstanceUID is None:  # the UID the archive gave it (PS3.7 10.1.5.1.4)
        rsp = Dataset()
        rsp.AffectedSOPInstanceUID = sop_uid
    return S.SUCCESS, rsp


def on_n_set(index: Index, event):
    """``EVT_N_SET``: (status, attribute list) of the N-SET-RSP."""
    req = event.request
    try:
        if str(req.RequestedSOPClassUID) != SOP_CLASS:
            raise MppsError(NO_SUCH_SOP_CLASS, f"N-SET of SOP Class {req.RequestedSOPClassUID}")
        sop_uid = str(req.RequestedSOPInstanceUID or "").strip()
        step = index.modify_mpps(sop_uid, _requester(event), _decoded(event, "modification_list"), time.time())
    except MppsError as e:
        log.warning("MPPS N-SET from %s refused: %s", _requester(event), e)
        return _refused(e), None
    except Exception as e:  # noqa: BLE001
        log.exception("MPPS N-SET failed")
        return S.dataset(PROCESSING_FAILURE, str(e)), None
    log.info("MPPS %s set by %s: %s (%d instance(s) listed)", sop_uid, _requester(event), step.status,
             len(step.references))
    return S.SUCCESS, None
