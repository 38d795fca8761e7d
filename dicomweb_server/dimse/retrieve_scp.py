"""The C-GET and C-MOVE SCP (PS3.4 C.4.2, C.4.3): the handlers :class:`~.scp.DimseServer`
binds for them, and the C-STORE sub-operations sent from the stored files.

Matching is :mod:`.retrieve` (the C-FIND query); counting the sub-operations, the pending
and the final responses (PS3.4 C.4.2.1.5, C.4.3.1.4) are pynetdicom's Query/Retrieve
service class, which calls ``Association.send_c_store`` for each instance the handler
yields: :func:`_send_c_store_from_file` replaces it while the listener runs
(``scp._receive_into``). A C-MOVE with nothing to send (refused, or matching nothing) is
answered without a connection to its destination (:class:`ListenerAE`).

References
----------
PS3.4 C.4.2 (C-MOVE), C.4.3 (C-GET), PS3.7 9.1.1.1 (C-STORE sub-operation parameters),
9.1.3 (C-GET), 9.1.4 (C-MOVE).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from pydicom import dcmread
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import UID
from pynetdicom import AE, build_context, evt
from pynetdicom.association import Association
from pynetdicom.sop_class import (
    PatientRootQueryRetrieveInformationModelGet,
    PatientRootQueryRetrieveInformationModelMove,
    StudyRootQueryRetrieveInformationModelGet,
    StudyRootQueryRetrieveInformationModelMove,
    Verification,
)

from .. import missing_data
from ..policy import transcode
from ..store.base import IndexUnavailable
from . import status as S
from . import tls
from .find import IdentifierError
from .retrieve import matching_instances, sending_contexts, sub_operation_syntax

log = logging.getLogger("dicomweb_server.dimse")

GET_MODELS = {PatientRootQueryRetrieveInformationModelGet: "patient", StudyRootQueryRetrieveInformationModelGet: "study"}
MOVE_MODELS = {PatientRootQueryRetrieveInformationModelMove: "patient",
               StudyRootQueryRetrieveInformationModelMove: "study"}

_status = S.dataset

#: pynetdicom's limit of requested presentation contexts (PS3.8 9.3.2.2: odd IDs 1-255)
MAX_CONTEXTS = 128

# --- C-GET / C-MOVE sub-operations sent from the stored file -------------------------------
#
# pynetdicom's Get/Move SCP takes a Dataset from the handler and sends it with
# ``send_c_store``: read whole (dcmread), then encoded whole into a buffer before the first
# P-DATA: a 600 MB enhanced MR sat in memory twice. ``send_c_store`` can send a file's data
# set in PDU-sized reads (``STORE_SEND_CHUNKED_DATASET``), but the SCPs accept only a
# Dataset from the handler, so the handler yields this small stand-in and the listener's
# ``send_c_store`` sends its file.

#: largest P-DATA PDU the listener sends (a peer announcing 0, "unlimited", PS3.8 D.1.1,
#: would otherwise get a file's whole data set read into one PDU)
SEND_PDU_MAX = 1 << 20


class StoredInstance(Dataset):
    """A stored instance to send as a C-STORE sub-operation: only its UIDs and transfer
    syntax in memory, its data set read from ``path`` fragment by fragment. For a C-MOVE,
    ``move_originator``: the calling AE title of the C-MOVE's requester."""

    def __init__(self, path: Path | None, sop_class_uid: str, sop_uid: str, transfer_syntax_uid: str,
                 move_originator: str | None = None) -> None:
        super().__init__()
        self.file_meta = FileMetaDataset()
        self.file_meta.TransferSyntaxUID = transfer_syntax_uid
        self.SOPClassUID = sop_class_uid
        self.SOPInstanceUID = sop_uid
        self.stored_path = path
        self.move_originator = move_originator


def _send_c_store_from_file(self, dataset, *args, **kwargs):
    """``Association.send_c_store``: a :class:`StoredInstance` is sent from its file, its
    stored bytes, when the peer accepted its stored transfer syntax on a context of its SOP
    class (in a C-GET: the requestor proposed it first, :mod:`.negotiation`; in a C-MOVE: the
    destination accepted the context proposing a compressed stored syntax alone,
    :func:`.retrieve.sending_contexts`); otherwise it is read and decoded or
    re-encoded into a syntax the peer accepted (:func:`_transcoded_for`).

    PS3.7 9.1.1.1: the Move Originator Application Entity Title of a C-MOVE's sub-operation is
    the AE that invoked the C-MOVE; pynetdicom's Move SCP passes its own AE title
    (``originator_aet=self.ae.ae_title``): replaced by the requester's. A SOP class the peer
    accepted no presentation context for fails here, before its file is read (PS3.4
    C.4.2.3.1, C.4.3.3.1: that sub-operation fails, the others go on)."""
    if isinstance(dataset, StoredInstance):
        if dataset.move_originator is not None and kwargs.get("originator_aet") is not None:
            kwargs["originator_aet"] = dataset.move_originator
        if dataset.stored_path is None:  # a failed sub-operation, counted with its UID (_send)
            raise FileNotFoundError(f"{missing_data.MESSAGE}: instance {dataset.SOPInstanceUID} cannot be read")
        accepted = [cx.transfer_syntax[0] for cx in self.accepted_contexts
                    if cx.abstract_syntax == dataset.SOPClassUID and cx.as_scu]
        if not accepted:  # (a C-GET requestor that took no SCP role for it: PS3.7 D.3.3.4)
            raise ValueError(f"the peer accepted no presentation context for SOP Class {dataset.SOPClassUID} "
                             f"of instance {dataset.SOPInstanceUID} with this archive sending")
        if dataset.file_meta.TransferSyntaxUID in accepted:
            dataset = dataset.stored_path  # STORE_SEND_CHUNKED_DATASET: read per fragment
        else:
            dataset = _transcoded_for(dataset, accepted)
    return _send_c_store(self, dataset, *args, **kwargs)


def _transcoded_for(stored: StoredInstance, accepted: list[str]) -> Dataset:
    """The stored instance in a transfer syntax the peer accepted for its SOP class
    (``accepted``: one per presentation context it can be sent on)
    (PS3.4 C.4.2.3.1, C.4.3.3.1; :func:`.retrieve.sub_operation_syntax`): decoded (and
    re-encoded) by policy/transcode.py, e.g. JPEG-LS stored, Explicit VR Little Endian
    accepted only; a lossy stored instance decoded keeps Lossy Image Compression "01"
    (PS3.3 C.7.6.1.1.5). ValueError, before the file is read, when nothing accepted can
    be produced from it (e.g. a JPEG 2000 Lossless instance, JPEG Extended accepted
    only): that sub-operation fails, the others go on."""
    stored_ts = str(stored.file_meta.TransferSyntaxUID)
    target = sub_operation_syntax(stored_ts, accepted)
    if target is None:
        raise ValueError(f"instance {stored.SOPInstanceUID} is stored in {UID(stored_ts).name}; the peer accepted "
                         f"SOP Class {stored.SOPClassUID} in {', '.join(UID(ts).name for ts in accepted)} only, "
                         "which cannot be produced from it")
    dataset = dcmread(stored.stored_path)
    if target == stored_ts:
        return dataset
    return transcode.transcode(dataset, target)


_send_c_store = Association.send_c_store


# --- a refused C-MOVE: no association to its destination ------------------------------------
#
# pynetdicom's Move SCP (``QueryRetrieveServiceClass._move_scp``) takes the destination from the
# handler, then the number of sub-operations, then associates with the destination, and only
# then asks the handler for its first (status, data set). Without associating, its handler
# protocol answers only 0xA801 (destination None) or Success (no sub-operation): a C-MOVE the
# archive refused (an identifier that does not match the SOP class...) made a TCP connection and
# an A-ASSOCIATE-RQ to the destination before its failure was sent. The handler asks for no
# association with the keyword below in the destination's ``AE.associate`` arguments; the
# listener's AE then returns :class:`_NotAssociated`, and pynetdicom answers the handler's
# failure as before (same Status, Error Comment, Offending Element and counts).

#: the keyword of the destination's ``AE.associate`` arguments (the handler's first yield)
#: asking :class:`ListenerAE` not to associate
NOT_ASSOCIATING = "dicomweb_not_associating"


class _NotAssociated:
    """Stands for the destination's association of a refused C-MOVE, which is never opened:
    pynetdicom's Move SCP reads ``is_established``, then, given the handler's final failure,
    calls ``release`` and sends that failure (dimse/pins.py pins its code)."""

    is_established = True

    def release(self) -> None:
        pass


class ListenerAE(AE):
    """The listener's Application Entity: ``associate`` given ``NOT_ASSOCIATING`` returns a
    :class:`_NotAssociated` (no connection); otherwise pynetdicom's."""

    def associate(self, addr, port, *args, **kwargs):  # type: ignore[override]
        if kwargs.pop(NOT_ASSOCIATING, False):
            return _NotAssociated()
        return super().associate(addr, port, *args, **kwargs)


class RetrieveSCP:
    """The C-GET and C-MOVE handlers of :class:`~.scp.DimseServer` (which provides
    ``archive``, ``settings``, ``peers``, ``_identifier`` and ``_access``)."""

    # --- C-GET and C-MOVE (PS3.4 C.4.2, C.4.3) --------------------------------------------

    def _matches(self, event, models):
        """(locations, None) or (None, failure status)."""
        model = models.get(event.request.AffectedSOPClassUID)
        identifier, why = self._identifier(event)
        if model is None or identifier is None:
            return None, _status(S.QR_UNABLE_TO_PROCESS, why or "identifier cannot be decoded")
        try:
            return matching_instances(self.archive.index, identifier, model, self.settings.max_results,
                                      self._access(event).filter), None
        except IdentifierError as e:
            return None, _status(S.QR_IDENTIFIER_MISMATCH, str(e), e.offending)
        except IndexUnavailable as e:  # unavailable is not out of resources: C-FIND's 0xC000
            log.error("C-GET/C-MOVE matching failed: %s", e)
            return None, _status(S.QR_UNABLE_TO_PROCESS, str(e))
        except Exception as e:
            log.exception("C-GET/C-MOVE matching failed")
            return None, _status(S.QR_OUT_OF_RESOURCES_MATCHES, str(e))

    def _send(self, event, locations, failure, move_originator: str | None = None):
        """The number of sub-operations, then pending responses with the data sets;
        pynetdicom sends each as a C-STORE sub-operation and counts
        remaining/completed/failed/warning (PS3.4 C.4.2.1.5). A failed match: 1, then its status
        (pynetdicom answers a count of 0 with Success at once: an identifier that does not match
        the SOP class, or an index that cannot be reached, was a Success with nothing sent; it
        counts the one announced as failed; a C-MOVE's failure is answered without associating
        with its destination: :data:`NOT_ASSOCIATING`)."""
        if failure is not None:
            yield 1
            yield failure, None
            return
        yield len(locations)
        for loc in locations:
            if event.is_cancelled:
                yield S.CANCEL, None
                return
            # sent from its file (StoredInstance). Objects (S3) are first copied to the spool,
            # one at a time: pynetdicom sends each yielded instance before it asks for the next,
            # so the copy lives for one send. A file or object gone since the match (a DELETE, or
            # missing data: logged and counted, missing_data.py) fails that sub-operation with its
            # UID in the Failed SOP Instance UID List (PS3.4 C.4.2.1.4): pynetdicom counts an
            # exception in send_c_store as a failure (a None data set is not counted at all).
            with contextlib.ExitStack() as copies:
                try:
                    if self.archive.blobs.local_files:
                        path = self.archive.blobs.resolve(loc.path)
                        if os.stat(path).st_size != loc.size:
                            raise FileNotFoundError(f"{loc.path} is not {loc.size} bytes long")
                    else:
                        path = copies.enter_context(self.archive.blobs.local_copy(loc.path))
                except Exception as e:  # noqa: BLE001 - unreadable in any way: that sub-operation fails
                    if not missing_data.confirm(self.archive.index, loc, e):
                        log.warning("C-GET/C-MOVE cannot read %s: %s", loc.sop_uid, e)
                    path = None
                yield S.PENDING, StoredInstance(path, loc.sop_class_uid, loc.sop_uid, loc.transfer_syntax_uid,
                                                move_originator)

    def _on_get(self, event):
        locations, failure = self._matches(event, GET_MODELS)
        yield from self._send(event, locations, failure)

    def _on_move(self, event):
        dest = event.move_destination
        dest = (dest.decode("ascii", "replace") if isinstance(dest, bytes) else str(dest)).strip()
        peer = self.peers.get(dest)
        if peer is None or peer.port is None:
            log.warning("C-MOVE to unknown destination %r%s", dest, " (no port in the peers file)" if peer else "")
            yield None, None  # pynetdicom answers 0xA801 Move Destination unknown
            return
        locations, failure = self._matches(event, MOVE_MODELS)
        if failure is not None or not locations:
            # nothing to send: no connection to the destination (ListenerAE.associate). Refused
            # (0xA900, 0xC000, 0xA701): that failure; nothing matched: Success, no sub-operation
            # (PS3.4 C.4.2.3.1; pynetdicom answers a count of 0 before it associates anyway)
            yield peer.host, peer.port, {NOT_ASSOCIATING: True}
            yield from self._send(event, locations, failure)
            return
        # propose what will be sent: the stored SOP classes and transfer syntaxes, a compressed
        # one in a context of its own (sending_contexts; <= 127 contexts)
        pairs = ((loc.sop_class_uid, loc.transfer_syntax_uid) for loc in locations)
        # and Verification: a destination that accepts none of the stored SOP classes still
        # associates, and each sub-operation fails on its own (0xA702, each instance listed),
        # where pynetdicom answered the association's refusal 0xA801 (destination unknown)
        contexts = [build_context(cls, syntaxes) for cls, syntaxes in sending_contexts(pairs, MAX_CONTEXTS - 1)]
        contexts.append(build_context(Verification))
        yield peer.host, peer.port, {"contexts": contexts, "ae_title": peer.ae_title,
                                     "tls_args": tls.tls_args(peer.tls, peer.host),  # PS3.15 Annex B
                                     "evt_handlers": [(evt.EVT_CONN_OPEN, _sub_operation_socket_timeout)]}
        requester = event.assoc.requestor.ae_title  # PS3.7 9.1.1.1: Move Originator AE Title
        yield from self._send(event, locations, None, str(requester).strip())


def _sub_operation_socket_timeout(event) -> None:
    """The C-MOVE destination's socket (connected: pynetdicom leaves it without a timeout)
    gets the network timeout: a destination that stops reading fails the sub-operation being
    sent and ends that association within it (PS3.4 C.4.2.3: the sub-operation fails, the
    C-MOVE goes on to its final response). Its DUL thread blocked in ``send`` for as long as
    the destination liked, and the C-MOVE with it."""
    sock = getattr(event.assoc.dul.socket, "socket", None)
    if sock is not None:
        sock.settimeout(event.assoc.network_timeout)
