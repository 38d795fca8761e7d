"""The operator's study page (``/ui/``) in headless Chromium: what arrived of a study, from
where, against what the senders declared (issue 32; docs/notes/sources.md).

One study: a series stored by STOW-RS by the Basic user ``alice`` (2 instances, each saying
Number of Series Related Instances 2) and a series sent by C-STORE from the AE title
``CT_SCANNER`` (2 instances saying 3, and Number of Study Related Instances 5), then a
Storage Commitment request from ``CT_SCANNER`` naming its two instances and one that never
came. The page must show, per series, the instances against the declared counts, the sizes
of the stored files and the sources, and the study's received time, size, sources, "4 of
declared 5" and the commitment's "2 of declared 3" with the missing SOP Instance UID.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import httpx
from pydicom.dataset import Dataset
from pydicom.uid import generate_uid
from pynetdicom import AE, build_context
from pynetdicom.sop_class import StorageCommitmentPushModel, StorageCommitmentPushModelInstance

from dicomweb_server.dimse import commitment
from tests.helpers import LiveServer, free_port, make_dataset

from .studies import stow_body
from .test_ohif_viewer import TIMEOUT_MS, VIEWPORT, browser  # noqa: F401 (the fixture)
from .test_operator_ui import _offline, login_basic


def _dimse_store(port: int, datasets: list[Dataset]) -> None:
    ae = AE(ae_title="CT_SCANNER")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    ae.add_requested_context(build_context(str(datasets[0].SOPClassUID)).abstract_syntax)
    ae.add_requested_context(StorageCommitmentPushModel)
    assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
    assert assoc.is_established
    try:
        assert [int(assoc.send_c_store(ds).Status) for ds in datasets] == [0] * len(datasets)
    finally:
        assoc.release()


def _commitment(port: int, tuid: str, refs: list[tuple[str, str]]) -> None:
    ae = AE(ae_title="CT_SCANNER")
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 30
    ae.add_requested_context(StorageCommitmentPushModel)
    assoc = ae.associate("127.0.0.1", port, ae_title="DICOMWEB")
    assert assoc.is_established
    ds = Dataset()
    ds.TransactionUID = tuid
    ds.ReferencedSOPSequence = []
    for cls, sop in refs:
        item = Dataset()
        item.ReferencedSOPClassUID, item.ReferencedSOPInstanceUID = cls, sop
        ds.ReferencedSOPSequence.append(item)
    try:
        status, _ = assoc.send_n_action(ds, commitment.REQUEST_STORAGE_COMMITMENT, StorageCommitmentPushModel,
                                        StorageCommitmentPushModelInstance)
        assert status.Status == 0x0000
    finally:
        assoc.release()


def test_study_page_shows_what_arrived_from_where(browser, tmp_path, artifacts):  # noqa: F811 (the fixture)
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"alice": {"password_sha256": hashlib.sha256(b"secret").hexdigest(),
                                           "scopes": ["read", "write"]}}))
    peers = tmp_path / "peers.toml"  # (with authentication on, the DIMSE peers are those named)
    peers.write_text(f'[CT_SCANNER]\nhost = "127.0.0.1"\nport = {free_port()}\nscopes = ["read", "write"]\n')
    port = free_port()
    a = LiveServer(tmp_path / "a", "sqlite", basic_users_file=users, dimse_port=port, dimse_in_worker=True,
                   dimse_peers_file=peers).start()
    study, by_stow, by_dimse = str(generate_uid()), str(generate_uid()), str(generate_uid())
    common = dict(study=study, PatientName="Arrivals^Check", PatientID="ARR-1", StudyDate="20240401")
    stowed = [make_dataset(series=by_stow, SeriesNumber=1, InstanceNumber=n, rows=8 * n, columns=8,
                           NumberOfSeriesRelatedInstances=2, **common) for n in (1, 2)]
    sent = [make_dataset(series=by_dimse, SeriesNumber=2, InstanceNumber=n, rows=16, columns=8 * n,
                         NumberOfSeriesRelatedInstances=3, NumberOfStudyRelatedInstances=5, **common) for n in (1, 2)]
    context = None
    try:
        body, ctype = stow_body(stowed)
        r = httpx.post(f"{a.url}/studies", content=body, headers={"Content-Type": ctype}, auth=("alice", "secret"),
                       timeout=60)
        assert r.status_code == 200, r.text
        _dimse_store(port, sent)
        missing = str(generate_uid())
        tuid = str(generate_uid())
        _commitment(port, tuid, [(str(d.SOPClassUID), str(d.SOPInstanceUID)) for d in sent]
                    + [(str(sent[0].SOPClassUID), missing)])
        # the stored files' sizes, from the disk (what the page must show)
        blobs = a.archive.blobs
        sizes = {loc.sop_uid: os.path.getsize(blobs.resolve(loc.path)) for loc in a.archive.index.instances(study)}
        assert len(sizes) == 4
        stow_bytes = sum(sizes[str(d.SOPInstanceUID)] for d in stowed)
        dimse_bytes = sum(sizes[str(d.SOPInstanceUID)] for d in sent)

        context = browser.new_context(viewport=VIEWPORT)
        refused = _offline(context, a.url)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        login_basic(page, a.url, "alice", "secret")
        page.goto(f"{a.url}/ui/#/study/{study}")
        page.get_by_role("heading", name="Study of Arrivals^Check").wait_for()

        rows = page.locator("#series tbody tr")
        rows.nth(1).locator("td").nth(5).locator("[data-bytes]").wait_for()
        cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
        # Number, Modality, Description, Instances (against the declared), Size, Source
        assert [c[1] for c in cells] == ["1", "2"]
        assert [c[4] for c in cells] == ["2 of declared 2", "2 of declared 3"]
        assert [c[6] for c in cells] == ["STOW-RS by alice (2)", "C-STORE from CT_SCANNER (2)"]
        assert [int(rows.nth(i).locator("td").nth(5).locator("[data-bytes]").get_attribute("data-bytes"))
                for i in range(2)] == [stow_bytes, dimse_bytes]
        assert rows.nth(1).locator("td").nth(4).locator(".bad").count() == 1  # one short: marked

        facts = page.locator("#arrival-facts")
        facts.wait_for()
        assert page.locator("#arrival-count").inner_text().startswith("4 of declared 5")
        assert int(page.locator("#arrival-size [data-bytes]").get_attribute("data-bytes")) == stow_bytes + dimse_bytes
        assert page.locator("#arrival-sources").inner_text() == "C-STORE from CT_SCANNER (2), STOW-RS by alice (2)"
        received = facts.locator("dd").first.inner_text()
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert received.startswith(today) and " to " in received
        row = page.locator("#arrivals tbody tr")
        assert row.count() == 1
        texts = row.first.locator("td").all_inner_texts()
        assert texts[1:] == ["Storage commitment", "CT_SCANNER", "2 of declared 3", missing, tuid]  # (kind: or MPPS)
        page.screenshot(path=str(artifacts / "operator-arrivals.png"), full_page=True)
        assert refused == []
    finally:
        if context is not None:
            context.close()
        a.stop()
