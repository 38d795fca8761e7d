"""The listener's presentation contexts per association: pynetdicom deep-copied all of them
(2,800 objects) for every association; the listener gives each association a new list of
the same objects, which negotiation only reads (checked here, with SCP/SCU role selection)."""

from __future__ import annotations

from copy import deepcopy

from pydicom import uid as U
from pynetdicom import AE, AllStoragePresentationContexts, build_context
from pynetdicom.presentation import negotiate_as_acceptor
from pynetdicom.sop_class import CTImageStorage, StudyRootQueryRetrieveInformationModelGet

from dicomweb_server.dimse.scp import TRANSFER_SYNTAXES, _copy_contexts


def _listener_contexts():
    ae = AE()
    for cx in AllStoragePresentationContexts:
        ae.add_supported_context(cx.abstract_syntax, TRANSFER_SYNTAXES, scu_role=True, scp_role=True)
    ae.add_supported_context(StudyRootQueryRetrieveInformationModelGet)
    return ae.supported_contexts


def test_each_association_gets_a_new_list_of_the_same_contexts():
    original = _listener_contexts()
    copied = _copy_contexts(original)
    assert copied is not original and copied == original
    assert all(a is b for a, b in zip(copied, original))  # no per-association copies
    copied.pop()  # the list is the association's own
    assert len(original) == len(copied) + 1
    assert _copy_contexts({"a": [1]}) == {"a": [1]}  # anything else: deepcopy


def test_negotiation_leaves_the_shared_contexts_unchanged():
    original = _listener_contexts()
    before = deepcopy([vars(c) for c in original])
    rq = []
    for i, (cls, ts) in enumerate([(CTImageStorage, [U.JPEG2000, U.ExplicitVRLittleEndian]),
                                   (StudyRootQueryRetrieveInformationModelGet, [U.ImplicitVRLittleEndian]),
                                   ("1.2.3.4", [U.ImplicitVRLittleEndian])]):
        cx = build_context(cls, ts)
        cx.context_id = 2 * i + 1
        rq.append(cx)
    roles = {CTImageStorage: (True, True)}  # a C-GET requestor's SCP/SCU role selection
    for _ in range(2):
        results, _roles = negotiate_as_acceptor(rq, _copy_contexts(original), roles)
        assert [r.result for r in results] == [0x00, 0x00, 0x03]
        assert results[0].transfer_syntax[0] in (U.JPEG2000, U.ExplicitVRLittleEndian)
        assert all(r is not c for r in results for c in original)
    assert [vars(c) for c in original] == before
