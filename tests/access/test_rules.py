"""access/rules.py: which identity sees which labels, and what a bad document is told."""

from __future__ import annotations

import pytest

from dicomweb_server.access.filter import UNRESTRICTED, only
from dicomweb_server.access.rules import AccessRules, RulesError
from dicomweb_server.api.auth import _identity_of
from dicomweb_server.identity import Identity

RULES = AccessRules.parse({"identities": {"oidc:radiology": ["radio"], "oidc:trial": ["trial-42", "x"],
                                          "basic:alice": ["cardio"], "basic:root": "*", "ae:CT1": ["radio"],
                                          "oidc-sub:boss": "*"},
                           "claim": "groups", "default": []})


def oidc(sub, *groups):
    return Identity(sub, frozenset({"read"}), "oidc", groups)


def test_identities_map_to_their_labels():
    assert RULES.access(Identity("alice", frozenset(), "basic")).filter == only({"cardio"})
    assert RULES.access(Identity("alice", frozenset(), "basic")).write_label == "cardio"
    assert RULES.access(Identity("root", frozenset(), "basic")).filter == UNRESTRICTED
    # several groups: the union; the write label is that of the first entry of the document
    both = RULES.access(oidc("u1", "trial", "radiology"))
    assert both.filter == only({"radio", "trial-42", "x"}) and both.write_label == "radio"
    assert RULES.access(oidc("boss", "radiology")).filter == UNRESTRICTED
    # named by no entry: the default (here: nothing)
    assert RULES.access(oidc("u2", "finance")).filter == only(set())
    assert RULES.access(oidc("u2", "finance")).write_label is None
    # DIMSE: by calling AE title, authenticated or not
    assert RULES.access(Identity("CT1", frozenset(), "anonymous"), dimse=True).filter == only({"radio"})
    # the anonymous HTTP client of an archive without authentication: everything
    assert RULES.access(Identity("anonymous", frozenset(), "anonymous")).filter == UNRESTRICTED
    assert AccessRules.parse({}).access(oidc("u", "radiology")).filter == UNRESTRICTED


def test_the_oidc_claim_is_configurable():
    claims = {"sub": "u", "scope": "read", "groups": ["radiology"], "dicom_labels": "trial"}
    assert _identity_of(claims).groups == ("radiology",)
    assert _identity_of(claims, "dicom_labels").groups == ("trial",)
    assert _identity_of({**claims, "groups": {"no": 1}}).groups == ()


@pytest.mark.parametrize("doc", [{"identities": {"radiology": ["a"]}}, {"identities": {"basic:x": "a"}},
                                 {"identities": {"basic:x": ["Bad Label"]}}, {"claims": "groups"},
                                 {"claim": ""}, []])
def test_a_bad_document_is_refused(doc):
    with pytest.raises(RulesError):
        AccessRules.parse(doc)


def test_serve_refuses_a_bad_rules_file_before_starting(tmp_path):
    import subprocess
    import sys

    rules = tmp_path / "rules.json"
    rules.write_text('{"identities": {"basic:alice": ["Cardio"]}}')
    r = subprocess.run([sys.executable, "-m", "dicomweb_server.cli", "serve", "--data-dir", str(tmp_path / "data"),
                        "--port", "0", "--dimse-port", "0", "--access-rules-file", str(rules)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("dicomweb-server: access rules: 'basic:alice': invalid label 'Cardio': "
                                "1 to 64 of a-z 0-9 . _ -, starting with a letter or digit")
