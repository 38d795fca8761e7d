/* The study page's actions: share, labels, merge, routing, rejection, edit, versions, history, delete. */
"use strict";

/* Share links (docs/share-links.md): POST /studies/{study}/share, GET /shares, DELETE /shares/{id} */
const EXPIRIES = [[86400, "1 day"], [7 * 86400, "7 days"], [30 * 86400, "30 days"]];

async function shareBox(uid) {
  const links = ((await json("/shares")) || []).filter((s) => s.study === uid && s.active);
  const select = el("select", { id: "share-expiry" }, EXPIRIES.map(([s, l]) => el("option", { value: s, selected: s === 7 * 86400 }, l)));
  const made = el("div", { id: "share-made" });
  const button = el("button", { type: "button", onclick: async () => {
    const label = select.selectedOptions[0].textContent;
    let doc = null;
    if (await act(`Make a link that lets anyone who has it read this study (viewer and DICOMweb, no account) for ${label}?`, "Share",
      async () => { doc = await json(dw(`/studies/${uid}/share`), { method: "POST", body: JSON.stringify({ expires_in: Number(select.value) }), headers: { "Content-Type": "application/json" } });
        return `Share link made; it expires ${doc.expires}. Its token is shown this once.`; })) {
      await refreshShares(uid);
      const out = document.getElementById("share-made");
      if (out && doc) out.replaceChildren(shareMade(doc));
    }
  } }, "Share…");
  return [
    el("p", {}, el("label", { for: "share-expiry" }, "Expires after "), select, " ", button),
    made,
    links.length ? table("This study's active share links (the token is shown once, when made)", [
      { label: "Link", cell: (s) => el("code", {}, s.id) },
      { label: "Created", cell: (s) => s.created },
      { label: "Expires", cell: (s) => s.expires },
      { label: "By", cell: (s) => s.creator },
      { label: "Actions", cell: (s) => el("button", { type: "button", "aria-label": `Revoke share link ${s.id}`, onclick: async () => {
        if (await act(`Revoke the share link ${s.id}? Whoever has it gets 401 from now on.`, "Revoke",
          async () => { await json(`/shares/${encodeURIComponent(s.id)}`, { method: "DELETE" }); return `Share link ${s.id} revoked.`; }))
          refreshShares(uid);
      } }, "Revoke") },
    ], links) : el("p", { id: "share-none" }, "No active share link."),
  ];
}

function shareMade(doc) {
  const url = el("input", { id: "share-url", readonly: true, value: doc.url, size: 60 });
  return el("p", { class: "share-made" }, el("label", { for: "share-url" }, "Viewer URL "), url, " ",
    el("button", { type: "button", onclick: async () => {
      try { await navigator.clipboard.writeText(doc.url); } catch (e) { url.select(); document.execCommand("copy"); }
      say("Copied the viewer URL.");
    } }, "Copy"),
    el("span", { class: "muted" }, ` DICOMweb root ${doc.dicomweb}, with Authorization: Bearer and the token in the URL; expires ${doc.expires}.`));
}

async function refreshShares(uid) {
  const s = document.getElementById("share");
  if (!s) return;
  const made = document.getElementById("share-made");
  try {
    s.replaceChildren(s.firstChild, ...(await shareBox(uid)));
    if (made) document.getElementById("share-made").replaceChildren(...made.childNodes);
  } catch (e) { say(e.message, true); }
}

/* Labels of a study (docs/notes/access-labels.md): PUT/DELETE /studies/{study}/labels/{label} */
const LABEL_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;

async function labelBox(uid) {
  const labels = (await json(dw(`/studies/${uid}/labels`))) || [];
  const input = el("input", { id: "label-new", name: "label", placeholder: "e.g. cardio", pattern: LABEL_RE.source, list: "labels-in-use" });
  const form = el("form", { class: "labels", "aria-label": "Add a label" },
    el("label", { for: "label-new" }, "New label (a-z 0-9 . _ -) "), input, " ",
    el("button", { type: "submit" }, "Add label"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const label = input.value.trim();
    if (!LABEL_RE.test(label)) { say(`"${label}" is not a label: 1 to 64 of a-z 0-9 . _ -, first a letter or digit.`, true); return; }
    if (await act(`Put the label "${label}" on this study? Who may see the study can change with it (access rules).`, "Add",
      async () => { const r = await json(dw(`/studies/${uid}/labels/${encodeURIComponent(label)}`), { method: "PUT" });
        return `Labels now: ${r.join(", ")}.`; })) refreshLabels(uid);
  });
  return [
    labels.length ? el("ul", { id: "label-list", class: "labels" }, labels.map((l) => el("li", {},
      el("a", { href: `#/find?label=${encodeURIComponent(l)}` }, l), " ",
      el("button", { type: "button", "aria-label": `Remove label ${l}`, onclick: async () => {
        if (await act(`Take the label "${l}" off this study?`, "Remove",
          async () => { const r = await json(dw(`/studies/${uid}/labels/${encodeURIComponent(l)}`), { method: "DELETE" });
            return r.length ? `Labels now: ${r.join(", ")}.` : "No label left."; })) refreshLabels(uid);
      } }, "Remove"))))
      : el("p", { id: "label-list" }, "No label."),
    form];
}

async function refreshLabels(uid) {
  const s = document.getElementById("labels");
  if (!s) return;
  try { s.replaceChildren(s.firstChild, ...(await labelBox(uid))); } catch (e) { say(e.message, true); }
}

/* $merge (docs/updates.md): every study of this study's patient moves under another patient */
function mergeForm(study) {
  const from = value(study, "00100020");
  const form = el("form", { class: "edit", "aria-label": "Merge this patient into another" },
    el("p", {}, `Moves every study of patient ID ${from || "(none)"} (not only this one) under the patient you name; each study gets a new version.`),
    el("label", {}, "Target patient ID", el("input", { name: "target-id", required: true })),
    el("label", {}, "Target patient name", el("input", { name: "target-name", placeholder: "kept if empty" })),
    el("button", { type: "submit" }, "Merge patient"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const id = form.elements["target-id"].value.trim();
    const name = form.elements["target-name"].value.trim();
    if (!id) return;
    const doc = { "00100020": { vr: "LO", Value: [id] } };
    if (name) doc["00100010"] = { vr: "PN", Value: [{ Alphabetic: name }] };
    const others = await json(dw(`/studies?PatientID=${encodeURIComponent(from)}&limit=1000`)).catch(() => null);
    const n = others ? others.length : "all";
    if (await act(`Merge patient ${from} into ${id}${name ? ` (${name})` : ""}: ${n} stud${n === 1 ? "y" : "ies"} of ${from} move to ${id}?`, "Merge",
      async () => { const r = await json(dw(`/patients/${encodeURIComponent(from)}/$merge`), { method: "POST", body: JSON.stringify(doc), headers: { "Content-Type": "application/dicom+json" } });
        return `Merged: ${r.studies.length} stud${r.studies.length === 1 ? "y" : "ies"} now under patient ${id}.`; }))
      route();
  });
  return form;
}

async function routing(uid) {
  const doc = await json(`/admin/queue/studies/${uid}`);
  const rows = Object.entries(doc.destinations).map(([name, d]) => ({ name, ...d }));
  const state = (d) => d.failed ? el("span", { class: "bad" }, "dead letter") :
    d.pending || d.in_flight ? "pending" : d.delivered ? el("span", { class: "ok" }, "delivered") : "not sent";
  return table("Per destination: this study's instances owed, delivered and given up on", [
    { label: "Destination", cell: (d) => d.name },
    { label: "Kind", cell: (d) => d.kind || "(no longer configured)" },
    { label: "State", cell: state },
    { label: "Delivered", num: true, cell: (d) => d.delivered },
    { label: "Pending", num: true, cell: (d) => d.pending + d.in_flight },
    { label: "Dead letters", num: true, cell: (d) => d.failed },
    { label: "Last error", cell: (d) => d.last_error || "" },
    { label: "Actions", cell: (d) => [
      d.kind === "stow" || d.kind === "dimse" ? el("button", { type: "button", onclick: async () => {
        if (await act(`Send every instance of this study to ${d.name}?`, "Send",
          async () => { const r = await json(`/admin/export/${encodeURIComponent(d.name)}/studies/${uid}`, { method: "POST" });
            return `${r.enqueued} instance(s) queued for ${d.name}.`; })) refreshRouting(uid);
      } }, `Send to ${d.name}`) : null,
      d.failed ? el("button", { type: "button", onclick: async () => {
        if (await act(`Retry the dead letters of ${d.name} (all its dead letters, not only this study's)?`, "Retry",
          async () => { const r = await json(`/admin/queue/retry-failed?destination=${encodeURIComponent(d.name)}`, { method: "POST" });
            return `${r.requeued} dead letter(s) back in the queue.`; })) refreshRouting(uid);
      } }, `Retry dead letters of ${d.name}`) : null,
    ] },
  ], rows);
}

async function refreshRouting(uid, rounds = 0) {
  const s = document.getElementById("routing");
  if (!s || location.hash !== `#/study/${uid}`) return;
  try {
    const t = await routing(uid);
    s.replaceChildren(s.firstChild, t, el("p", { class: "muted" }, `updated ${new Date().toLocaleTimeString()}`));
  } catch (e) {
    say(e.message, true);
  }
  if (rounds < 30) setTimeout(() => refreshRouting(uid, rounds + 1), 1000);  // the forwarder works on
}

const REASONS = [
  ["113001^DCM", "Rejected for Quality Reasons"], ["113037^DCM", "Rejected for Patient Safety Reasons"],
  ["113039^DCM", "Data Retention Policy Expired"], ["113038^DCM", "Incorrect Modality Worklist Entry"],
];

async function rejection(uid, rows) {
  rows = rows || [];
  if (rows.length) {
    return [el("p", { id: "rejection-state" }, `${rows.length} instance(s) rejected (${[...new Set(rows.map((r) => r.Reason))].join(", ")}), since ${new Date(rows[0].Time * 1000).toLocaleString()}. Hidden from every search and retrieve.`),
      el("button", { type: "button", onclick: async () => {
        if (await act("Restore the rejected instances of this study (they show again)?", "Restore",
          async () => { const r = await json(dw(`/studies/${uid}/$restore-rejected`), { method: "POST" }); return `${r.count} instance(s) restored.`; }))
          route();
      } }, "Restore rejected instances")];
  }
  const select = el("select", { id: "reject-reason" }, REASONS.map(([code, label]) => el("option", { value: code }, `${label} (${code})`)));
  return [el("p", { id: "rejection-state" }, "Not rejected."),
    el("label", { for: "reject-reason" }, "Reason "), select, " ",
    el("button", { type: "button", onclick: async () => {
      if (await act(`Reject the whole study (${select.selectedOptions[0].textContent})? It is hidden from every search and retrieve until restored.`, "Reject",
        async () => { const r = await json(dw(`/studies/${uid}/reject/${encodeURIComponent(select.value)}`), { method: "POST" }); return `${r.count} instance(s) rejected.`; }))
        route();
    } }, "Reject study")];
}

const EDITABLE = [
  ["00100010", "PN", "Patient name"], ["00100020", "LO", "Patient ID"], ["00100030", "DA", "Birth date (YYYYMMDD)"],
  ["00100040", "CS", "Sex"], ["00080050", "SH", "Accession number"], ["00081030", "LO", "Study description"],
];

function editForm(uid, study) {
  const form = el("form", { class: "edit", "aria-label": "Edit patient and study attributes" },
    EDITABLE.map(([tag, vr, label]) => el("label", {}, label, el("input", { name: tag, value: value(study, tag), "data-was": value(study, tag) }))),
    el("button", { type: "submit", class: "primary" }, "Save changes"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const doc = {};
    for (const [tag, vr] of EDITABLE) {
      const input = form.elements[tag];
      if (input.value === input.dataset.was) continue;
      doc[tag] = { vr, Value: input.value === "" ? undefined : [vr === "PN" ? { Alphabetic: input.value } : input.value] };
      if (!doc[tag].Value) delete doc[tag].Value;
    }
    const names = Object.keys(doc).map((t) => EDITABLE.find((e) => e[0] === t)[2]);
    if (!names.length) { say("Nothing changed."); return; }
    if (await act(`Change ${names.join(", ")} of every instance of this study ($update: each instance gets a new version)?`, "Save",
      async () => { await json(dw(`/studies/${uid}/$update`), { method: "POST", body: JSON.stringify(doc), headers: { "Content-Type": "application/dicom+json" } });
        return `Updated: ${names.join(", ")}.`; }))
      route();
  });
  return form;
}

async function versionList(uid) {
  const inst = (await json(dw(`/studies/${uid}/instances?limit=20&includefield=00200013`))) || [];
  const rows = await Promise.all(inst.map(async (i) => {
    const v = await json(dw(`/studies/${uid}/series/${value(i, "0020000E")}/instances/${value(i, "00080018")}/versions`));
    return { i, v };
  }));
  return table(`Versions of the study's first ${rows.length} instance(s)`, [
    { label: "Instance", cell: (r) => el("code", {}, value(r.i, "00080018")) },
    { label: "Versions", num: true, cell: (r) => r.v.length },
    { label: "Current size", num: true, cell: (r) => { const c = r.v.find((x) => x.current); return c ? `${c.size.toLocaleString()} B` : ""; } },
    { label: "History", cell: (r) => r.v.map((x) => `v${x.version} ${x.action} ${x.time}`).join("; ") },
  ], rows);
}

async function changeHistory(uid) {  // not "history": that would replace window.history
  const latest = await json(dw("/changefeed/latest?includemetadata=false"));
  if (!latest) return el("p", {}, "The change log is empty.");
  const last = latest.Sequence;
  const entries = [];
  for (let offset = Math.max(0, last - 300); offset < last; offset += 100) {
    entries.push(...(await json(dw(`/changefeed?offset=${offset}&limit=100&includemetadata=false`))));
  }
  const mine = entries.filter((e) => e.StudyInstanceUid === uid).reverse();
  return table(`This study's entries among the archive's last ${Math.min(last, 300)} changes, newest first`, [
    { label: "Sequence", num: true, cell: (e) => e.Sequence },
    { label: "Time", cell: (e) => e.Timestamp },
    { label: "Action", cell: (e) => e.Action },
    { label: "State", cell: (e) => e.State },
    { label: "Instance", cell: (e) => el("code", {}, e.SopInstanceUid) },
  ], mine.slice(0, 50));
}

function deleteBox(uid) {
  return el("button", { type: "button", class: "danger", onclick: async () => {
    if (await act("Delete this study and all its instances from the archive? This cannot be undone.", "Delete",
      async () => { await api(dw(`/studies/${uid}`), { method: "DELETE" }); return `Study ${uid} deleted.`; }))
      location.hash = "#/find";
  } }, "Delete study");
}
