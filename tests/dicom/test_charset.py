"""dicom/charset.py: the Specific Character Set of a data set built from Unicode values
(PS3.4 C.4.1.1.3.2, PS3.5 §6.1.2.3), checked on the bytes pynetdicom sends."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from pydicom.dataset import Dataset
from pynetdicom import AE, evt
from pynetdicom.dsutils import decode, encode
from pynetdicom.sop_class import StudyRootQueryRetrieveInformationModelFind

from dicomweb_server.dicom.charset import choose, configured, holds, set_character_set, terms
from dicomweb_server.dimse.peers import Peer
from dicomweb_server.dimse.pull import find_studies


def _wire(ds: Dataset) -> tuple[bytes, Dataset]:
    """The Implicit VR Little Endian bytes of ``ds`` and the data set read back from them."""
    raw = encode(ds, True, True)
    return raw, decode(io.BytesIO(raw), True, True)


def _answer(name: str, description: str = "") -> Dataset:
    ds = Dataset()
    ds.PatientName = name
    ds.PatientID = "P1"
    item = Dataset()
    item.ScheduledProcedureStepDescription = description
    ds.ScheduledProcedureStepSequence = [item]
    return ds


@pytest.mark.parametrize("value, expected", [
    (None, None), ("", None), (["", ""], None), ("ISO_IR 100", ("ISO_IR 100",)), (" ISO_IR 192 ", ("ISO_IR 192",)),
    (["", "ISO 2022 IR 87"], ("", "ISO 2022 IR 87")), (b"ISO_IR 100", ("ISO_IR 100",)),
    ("ISO-IR 100", None), ("KLINGON", None), (["ISO 2022 IR 100", ""], None),
    (["", "ISO_IR 192"], None), (["ISO_IR 192", "ISO 2022 IR 87"], None),  # UTF-8 takes no code extensions
    (["", "ISO 2022 IR 58"], None),  # review: pydicom writes GB 2312 without its escape sequence
])
def test_terms(value, expected):
    assert terms(value) == expected


@pytest.mark.parametrize("charset, value, held", [
    (("ISO_IR 100",), "Müller^Jörg", True),
    (("ISO_IR 100",), "Ωmega^山田", False),
    (("ISO_IR 126",), "Ωmega", True),
    (("ISO_IR 6",), "Müller", False),  # the default repertoire is ASCII, not pydicom's Latin-1
    (("", "ISO 2022 IR 87"), "山田^太郎", True),
    (("", "ISO 2022 IR 87"), "Müller", False),
    (("", "ISO 2022 IR 100"), "Müller", False),  # pydicom would leave out the escape sequence
    (("ISO 2022 IR 100", "ISO 2022 IR 126"), "Müller Ωmega", True),
    (("ISO_IR 192",), "Ωmega^山田 Müller", True),
])
def test_holds(charset, value, held):
    assert holds(charset, [value]) is held


def test_choice_order():
    assert choose(["Doe^John"], ("ISO_IR 100",)) is None  # ASCII: none
    assert choose(["Müller"]) == ("ISO_IR 192",)
    assert choose(["Müller"], ("ISO_IR 100",), ("ISO_IR 192",)) == ("ISO_IR 100",)
    assert choose(["Müller"], None, ("ISO_IR 100",)) == ("ISO_IR 100",)  # no request: the data's own
    assert choose(["Müller", "山田"], ("ISO_IR 100",), ("ISO_IR 100",)) == ("ISO_IR 192",)
    assert configured("") is None and configured("ISO_IR 100") == ("ISO_IR 100",)
    assert configured("\\ISO 2022 IR 87") == ("", "ISO 2022 IR 87") and configured("ISO-IR 100") is None


@pytest.mark.parametrize("name, description, preferred, charset, raw", [
    ("Müller^Jörg", "Schädel", [("ISO_IR 100",)], "ISO_IR 100", "Müller^Jörg".encode("latin-1")),
    ("Müller^Jörg", "Schädel", [], "ISO_IR 192", "Müller^Jörg".encode()),
    ("Ωmega^山田", "Schädel", [("ISO_IR 100",)], "ISO_IR 192", "Ωmega^山田".encode()),
    ("山田^太郎", "頭部", [("", "ISO 2022 IR 87")], ["", "ISO 2022 IR 87"], b"\x1b$B;3ED\x1b(B^\x1b$BB@O:\x1b(B"),
    # the item's value decides: Latin-1 is not in that set
    ("山田^太郎", "Schädel", [("", "ISO 2022 IR 87")], "ISO_IR 192", "山田^太郎".encode()),
])
def test_set_character_set_on_the_wire(name, description, preferred, charset, raw):
    ds = set_character_set(_answer(name, description), *preferred)
    assert ds.SpecificCharacterSet == charset
    data, back = _wire(ds)
    assert raw in data and b"?" not in data
    assert str(back.PatientName) == name
    assert back.ScheduledProcedureStepSequence[0].ScheduledProcedureStepDescription == description


def test_ascii_answer_loses_its_character_set_and_items_theirs():
    ds = _answer("Doe^John", "Head")
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.ScheduledProcedureStepSequence[0].SpecificCharacterSet = "ISO_IR 100"
    set_character_set(ds, ("ISO_IR 100",))
    assert "SpecificCharacterSet" not in ds and "SpecificCharacterSet" not in ds.ScheduledProcedureStepSequence[0]
    # an item's own set would encode the item in it: one choice for the whole answer
    ds = _answer("Ωmega", "山田")
    ds.ScheduledProcedureStepSequence[0].SpecificCharacterSet = "ISO_IR 100"
    set_character_set(ds)
    data, back = _wire(ds)
    assert back.ScheduledProcedureStepSequence[0].ScheduledProcedureStepDescription == "山田"
    assert b"?" not in data


def test_pull_c_find_identifier_names_its_character_set():
    """The archive as C-FIND SCU (dimse/pull.py): a non-ASCII key from a pull's query goes out
    with (0008,0005) and its bytes in it (PS3.4 C.4.1.1.3.1), read by a real pynetdicom SCP."""
    seen: list[Dataset] = []

    def on_find(event):
        seen.append(event.identifier)
        yield 0x0000, None

    scp = AE(ae_title="REMOTE")
    scp.add_supported_context(StudyRootQueryRetrieveInformationModelFind)
    server = scp.start_server(("127.0.0.1", 0), block=False, evt_handlers=[(evt.EVT_C_FIND, on_find)])
    try:
        port = server.socket.getsockname()[1]
        settings = SimpleNamespace(ae_title="DICOMWEB", dimse_acse_timeout=10, dimse_timeout=10,
                                   dimse_network_timeout=10, dimse_character_set="ISO_IR 100")
        assert find_studies(Peer("REMOTE", "127.0.0.1", port), settings, {"PatientName": "Ωmega^山田*"}, [],
                            False) == []  # not in the archive's ISO_IR 100: UTF-8
        assert find_studies(Peer("REMOTE", "127.0.0.1", port), settings, {"PatientName": "Müller*"}, [],
                            False) == []  # in it
    finally:
        server.shutdown()
    kanji, latin = seen
    assert kanji.SpecificCharacterSet == "ISO_IR 192"
    assert kanji.get_item(0x00100010).value.rstrip(b" ") == "Ωmega^山田*".encode()  # raw: not read yet
    assert str(kanji.PatientName) == "Ωmega^山田*"
    assert latin.SpecificCharacterSet == "ISO_IR 100"
    assert latin.get_item(0x00100010).value.rstrip(b" ") == "Müller*".encode("latin-1")


def test_gb2312_requested_is_not_written_without_its_escape_sequence():
    """Found in review: an SCU asking ``\\ISO 2022 IR 58`` got a Chinese name as GB 2312 bytes
    without ``ESC $ ) A`` (PS3.5 Annex K), which a reader decodes as Latin-1 garbage. The
    answer is in UTF-8 instead, and reads back as the name."""
    ds = _answer("Zhang^XiaoDong=张^小东")
    set_character_set(ds, terms(["", "ISO 2022 IR 58"]), None, None)
    assert ds.SpecificCharacterSet == "ISO_IR 192"
    back = decode(io.BytesIO(encode(ds, False, True)), False, True)  # as pynetdicom sends and reads it
    assert str(back.PatientName) == "Zhang^XiaoDong=张^小东"
