"""Presentation context negotiation as the association acceptor: the requestor's order of
preference decides the transfer syntax (docs/conformance.md, "SOP classes and presentation
contexts").

PS3.7 D.3.2 and PS3.8 §9.3.2.2 / §9.3.3.2: a requestor may offer several transfer syntaxes
in one presentation context, in the order it prefers them, and the acceptor accepts exactly
one; the standard leaves the choice to the acceptor. pynetdicom chooses by the acceptor's
own order (``presentation.negotiate_as_acceptor`` walks the supported context's list,
:data:`.scp.TRANSFER_SYNTAXES`, Explicit VR Little Endian first): a C-GET requestor proposing
JPEG 2000 Lossless first, then the uncompressed syntaxes, for the storage contexts it takes
the SCP role on (PS3.7 D.3.3.4; DCMTK's ``getscu +xv``) got Explicit VR Little Endian, and
every instance stored as JPEG 2000 was decoded before it was sent; a C-STORE requestor
offering [JPEG 2000 Lossless, Explicit VR Little Endian] in one context had to send
uncompressed.

The rule here, after pynetdicom's negotiation (abstract syntax, roles, rejections: kept):

- a context the archive only receives on (C-STORE, C-FIND...): the requestor's first
  proposed syntax that the listener supports for its abstract syntax, except that a lossy
  one (JPEG Baseline, JPEG 2000, HTJ2K, JPEG-LS near-lossless: PS3.5 §8.2) is passed over
  when the requestor proposed a lossless one in the same context: the archive then receives
  the images losslessly, as it did before it honoured the requestor's order (a modality
  proposing only lossy syntaxes still gets one);
- a context the archive sends C-STOREs on (``as_scu``: C-GET's storage contexts, the
  requestor taking the SCP role): the requestor's first proposed syntax that the archive can
  send *every* stored instance in (:data:`SENDABLE_EVERY`): Explicit or Implicit VR Little
  Endian, or Deflated Explicit VR Little Endian. One context carries every instance of its SOP
  class, and which instances a C-GET asks for is known only after negotiation: a compressed
  first choice would fail the sub-operation of every instance that cannot be encoded in it
  (the lossless encoders refuse 1-bit Segmentations and 32-bit pixels; a lossy syntax, JPEG
  Lossless Process 14 and Big Endian are produced only from instances stored in them), which
  the requestor's uncompressed fallback carries. Such a first choice is passed over; proposed
  alone (or only with others like it), it is accepted (pynetdicom's choice): the instances
  stored in it are sent as stored, the others re-encoded when they can be, else failed.

Among the plain encodings (Explicit VR Little Endian, Implicit VR Little Endian, Explicit VR
Big Endian) the archive's preference stays: a first choice among them gives the first of them,
in that order, that the requestor proposed (pynetdicom's choice, as before). They carry the same values; the explicit VRs
are kept (a private element received Implicit VR is stored without its VR), and pynetdicom's
default contexts (Implicit VR Little Endian first) keep being stored as Explicit VR Little
Endian, as before. Deflated and the compressed syntaxes are a requestor's choice to honour.
"""

from __future__ import annotations

from pydicom import uid as U
from pynetdicom import acse, presentation

from ..dicom.compressed import LOSSY

_negotiate_as_acceptor = presentation.negotiate_as_acceptor
#: the plain encodings, among which Explicit VR Little Endian is preferred
_PLAIN = frozenset({U.ExplicitVRLittleEndian, U.ImplicitVRLittleEndian, U.ExplicitVRBigEndian})
#: what the archive can send every stored instance it decodes in, on a context it sends on
#: (C-GET's storage contexts): native little endian (pynetdicom deflates Deflated Explicit VR
#: Little Endian). Not the lossless compressed syntaxes: their encoders refuse some pixel data
#: (1-bit, 32-bit: a 1-bit Segmentation's C-GET failed with J2K Lossless accepted, review)
SENDABLE_EVERY = frozenset({U.ExplicitVRLittleEndian, U.ImplicitVRLittleEndian, U.DeflatedExplicitVRLittleEndian})


def negotiate_as_acceptor(rq_contexts, ac_contexts, roles=None):
    """``presentation.negotiate_as_acceptor``, then each accepted context's transfer syntax
    is the first the requestor proposed among those ``ac_contexts`` hold for its abstract
    syntax (and, on a context the archive sends on, among :data:`SENDABLE_EVERY`);
    for a plain first choice, the first plain one in the archive's order."""
    result, ac_roles = _negotiate_as_acceptor(rq_contexts, ac_contexts, roles)
    proposed = {(cx.context_id, cx.abstract_syntax): cx.transfer_syntax
                for cx in rq_contexts or () if len(cx.transfer_syntax) > 1}
    chosen = [cx for cx in result if cx.result == 0x00 and (cx.context_id, cx.abstract_syntax) in proposed]
    if not chosen:
        return result, ac_roles
    needed = {cx.abstract_syntax for cx in chosen}
    supported = {c.abstract_syntax: c.transfer_syntax for c in ac_contexts if c.abstract_syntax in needed}
    for cx in chosen:
        held = supported.get(cx.abstract_syntax, ())
        sendable = SENDABLE_EVERY if cx.as_scu else None
        offered = proposed[(cx.context_id, cx.abstract_syntax)]
        candidates = [ts for ts in offered if ts in held and (sendable is None or ts in sendable)]
        # a lossy first choice is passed over for a lossless one proposed with it (receiving)
        lossless = [ts for ts in candidates if ts not in LOSSY]
        first = (lossless or candidates or [None])[0]
        # a plain first choice: pynetdicom's, by the table's order (Explicit VR LE, Implicit, Big Endian)
        if first is not None and first not in _PLAIN and first != cx.transfer_syntax[0]:
            cx.transfer_syntax = [first]
    return result, ac_roles


def install() -> None:
    """Process-wide while a listener runs (``acse`` calls the name it imported)."""
    acse.negotiate_as_acceptor = negotiate_as_acceptor  # type: ignore[attr-defined]


def uninstall() -> None:
    acse.negotiate_as_acceptor = _negotiate_as_acceptor  # type: ignore[attr-defined]
