"""HL7 v2 ORM^O01 orders on the MLLP port (orders/hl7v2.py, orders/mllp.py): real MLLP frames
on a socket; a new order becomes a worklist entry (the IHE mapping), a cancel removes it, each
answered by an ACK (AA, AE, AR) echoing the Message Control ID; an oversized or unframed
message closes the connection and writes nothing."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.helpers import LiveServer, free_port

VT, FS, CR = b"\x0b", b"\x1c", b"\r"


def orm(control: str, sps_id: str, msg_id: str = "MSG0001", pid3: str = "P1^^^HOSP", kind: str = "ORM^O01") -> str:
    obr = {1: "1", 2: f"PO{sps_id}", 3: f"FO{sps_id}", 4: "CTH^CT head w/o contrast^L", 16: "5678^House^Gregory",
           18: f"A{sps_id}", 19: f"RP{sps_id}", 20: sps_id, 21: "CT1", 24: "CT", 27: "^^^20260105090000"}
    return "\r".join([
        f"MSH|^~\\&|RIS|HOSP|PACS|HOSP|20260105080000||{kind}|{msg_id}|P|2.5",
        f"PID|1||{pid3}||Doe^Jane^Q^^Dr||19700101|F",
        "PV1|1|O||||||1234^Welby^Marcus",
        f"ORC|{control}|PO{sps_id}|FO{sps_id}||SC||^^^20260105083000",
        "|".join(["OBR"] + [obr.get(n, "") for n in range(1, 28)]),
        "ZDS|1.2.826.0.1.3680043.8.498.77^RIS^Application^DICOM",
    ]) + "\r"


def frame(text: str) -> bytes:
    return VT + text.encode() + FS + CR


def read_frame(sock: socket.socket) -> str:
    buf = b""
    while not buf.endswith(FS + CR):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {buf!r}")
        buf += chunk
    assert buf.startswith(VT)
    return buf[1:-2].decode()


def msa(ack: str) -> list[str]:
    [line] = [seg for seg in ack.split("\r") if seg.startswith("MSA|")]
    return line.split("|")[1:]


@pytest.fixture
def orders(tmp_path):
    port, hl7_port = free_port(), free_port()
    srv = LiveServer(tmp_path / "data", "sqlite", dimse_port=port, dimse_in_worker=True, dimse_peers_file=None,
                     hl7_port=hl7_port, hl7_max_message=4096).start()
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        yield client, hl7_port
    srv.stop()


def _send(port: int, *messages: str) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        out = []
        for m in messages:
            sock.sendall(frame(m))
            out.append(read_frame(sock))
        return out


def test_new_order_then_cancel(orders):
    http, port = orders
    [ack] = _send(port, orm("NW", "SPS77"))
    assert ack.split("\r")[0].split("|")[8] == "ACK^O01^ACK"  # MSH-9
    assert msa(ack) == ["AA", "MSG0001"]
    entry = http.get("/worklist/SPS77").json()
    sps = entry["00400100"]["Value"][0]
    assert {k: entry[k]["Value"] for k in ("00100020", "00100021", "00100010", "00100030", "00100040", "00080090",
                                          "00402016", "00402017", "00321060", "00321032", "00080050", "00401001",
                                          "0020000D")} == {
        "00100020": ["P1"], "00100021": ["HOSP"], "00100010": [{"Alphabetic": "Doe^Jane^Q^Dr"}],
        "00100030": ["19700101"], "00100040": ["F"], "00080090": [{"Alphabetic": "Welby^Marcus"}],
        "00402016": ["POSPS77"], "00402017": ["FOSPS77"], "00321060": ["CT head w/o contrast"],
        "00321032": [{"Alphabetic": "House^Gregory"}], "00080050": ["ASPS77"], "00401001": ["RPSPS77"],
        "0020000D": ["1.2.826.0.1.3680043.8.498.77"]}
    assert entry["00321064"]["Value"] == [{"00080100": {"vr": "SH", "Value": ["CTH"]},
                                          "00080102": {"vr": "SH", "Value": ["L"]},
                                          "00080104": {"vr": "LO", "Value": ["CT head w/o contrast"]}}]
    assert {k: v["Value"][0] for k, v in sps.items()} == {
        "00400009": "SPS77", "00400020": "SCHEDULED", "00400007": "CT head w/o contrast", "00080060": "CT",
        "00400001": "CT1", "00400002": "20260105", "00400003": "090000"}
    # the worklist C-FIND's prefilter columns took it: found by station and date
    found = http.get("/worklist", params={"ScheduledProcedureStepSequence.ScheduledStationAETitle": "CT1",
                                          "ScheduledProcedureStepSequence.ScheduledProcedureStepStartDate":
                                              "20260101-20260110"}).json()
    assert [e["00400100"]["Value"][0]["00400009"]["Value"][0] for e in found] == ["SPS77"]
    # cancel, then cancel again: the second names an entry no longer there
    acks = _send(port, orm("CA", "SPS77", "MSG0002"), orm("CA", "SPS77", "MSG0003"))
    assert [msa(a)[:2] for a in acks] == [["AA", "MSG0002"], ["AE", "MSG0003"]]
    assert msa(acks[1])[2] == "no worklist entry 'SPS77' to cancel"
    assert http.get("/worklist/SPS77").status_code == 404


def test_refused_messages(orders):
    http, port = orders
    acks = _send(port, orm("NW", "SPS1", "M1", kind="ADT^A01"), orm("XO", "SPS1", "M2"),
                 orm("NW", "SPS1", "M3", pid3=""))
    assert [msa(a)[:2] for a in acks] == [["AR", "M1"], ["AR", "M2"], ["AE", "M3"]]
    assert msa(acks[0])[2] == r"message type ADT\S\A01: only ORM\S\O01"  # (^ escaped: HL7 v2.5 2.7)
    assert http.get("/worklist").json() == []
    # longer than hl7_max_message: the connection closes, nothing stored; a new one is served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(frame(orm("NW", "SPS2") + "NTE|1||" + "x" * 8000 + "\r"))
        with pytest.raises(ConnectionError):
            read_frame(sock)
    # not MLLP framed (no <VT>): closed
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(orm("NW", "SPS3").encode() + FS + CR)
        with pytest.raises(ConnectionError):
            read_frame(sock)
    assert http.get("/worklist").json() == []
    assert [msa(a)[0] for a in _send(port, orm("NW", "SPS4", "M4"))] == ["AA"]


def test_an_idle_connection_is_closed(monkeypatch):
    """A connection that sends nothing is closed after IDLE_SECONDS (it was held for ever:
    idle sockets of order systems piled up)."""
    from dicomweb_server.orders import mllp

    monkeypatch.setattr(mllp, "IDLE_SECONDS", 0.3)
    listener = mllp.OrderListener(None, "ARCHIVE", 1 << 20)  # (no message: the index is never used)
    port = listener.start("127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            assert s.recv(1) == b""  # closed by the listener, long before the 10 s timeout
    finally:
        listener.stop()
