"""The listener's per-association copy of its presentation contexts equals pynetdicom's
deepcopy (values) and shares nothing mutable with the original."""

from __future__ import annotations

from copy import deepcopy

from pynetdicom import AE, AllStoragePresentationContexts

from dicomweb_server.dimse.scp import TRANSFER_SYNTAXES, _copy_contexts


def test_copy_equals_deepcopy():
    ae = AE()
    for cx in AllStoragePresentationContexts:
        ae.add_supported_context(cx.abstract_syntax, TRANSFER_SYNTAXES, scu_role=True, scp_role=True)
    original = ae.supported_contexts
    copied = _copy_contexts(original)
    assert [vars(c) for c in copied] == [vars(c) for c in deepcopy(original)]
    for a, b in zip(copied, original):
        assert a is not b and a._transfer_syntax is not b._transfer_syntax
    copied[0].context_id = 99
    copied[0]._transfer_syntax.append("1.2.3")
    assert original[0].context_id != 99 and "1.2.3" not in original[0]._transfer_syntax
    assert _copy_contexts({"a": [1]}) == {"a": [1]}  # anything else: deepcopy
