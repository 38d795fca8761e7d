"""Accept parsing and negotiation (PS3.18 §8.7)."""

from __future__ import annotations

import pytest

from dicomweb_server.dicom.media_types import (
    NotAcceptable,
    negotiate_frames,
    negotiate_instances,
    negotiate_json,
    parse_accept,
)

ELE, JPEG = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.4.50"


def yes(_ts):
    return True


def no(_ts):
    return False


def test_parse_accept_quotes_case_q():
    rs = parse_accept('text/html;q=0.2, Multipart/Related; Type="application/dicom"; transfer-syntax="*", */*;q=0')
    assert [r.type for r in rs] == ["multipart/related", "text/html"]
    assert rs[0].params == {"type": "application/dicom", "transfer-syntax": "*"}
    assert parse_accept(None)[0].type == "*/*"


def test_instances():
    acc = parse_accept('multipart/related; type="application/dicom"; transfer-syntax=*')
    c = negotiate_instances(acc, JPEG, no, True)
    assert (c.transfer_syntax, c.transcode, c.multipart) == (JPEG, False, True)
    c = negotiate_instances(parse_accept("multipart/related; type=application/dicom"), JPEG, yes, True)
    assert (c.transfer_syntax, c.transcode, c.defaulted) == (ELE, True, True)
    c = negotiate_instances(parse_accept("multipart/related; type=application/dicom"), JPEG, no, True)
    assert (c.transfer_syntax, c.transcode, c.defaulted) == (JPEG, False, True)
    with pytest.raises(NotAcceptable):
        negotiate_instances(parse_accept(f"application/dicom; transfer-syntax={ELE}"), JPEG, no, True)
    with pytest.raises(NotAcceptable):
        negotiate_instances(parse_accept("application/dicom"), ELE, yes, False)


def test_frames():
    c = negotiate_frames(parse_accept('multipart/related; type="image/jpeg"'), JPEG, no)
    assert (c.media_type, c.transfer_syntax) == ("image/jpeg", JPEG)
    c = negotiate_frames(parse_accept("multipart/related; type=application/octet-stream"), JPEG, yes)
    assert (c.media_type, c.transfer_syntax, c.transcode) == ("application/octet-stream", ELE, True)
    c = negotiate_frames(parse_accept("multipart/related; type=application/octet-stream; transfer-syntax=*"), JPEG, yes)
    assert (c.media_type, c.transfer_syntax) == ("image/jpeg", JPEG)
    with pytest.raises(NotAcceptable):
        negotiate_frames(parse_accept('multipart/related; type="image/jp2"'), JPEG, yes)
    with pytest.raises(NotAcceptable):
        negotiate_frames(parse_accept('multipart/related; type="image/jpeg"'), ELE, yes)


def test_json():
    assert negotiate_json(parse_accept("application/json")) == "application/dicom+json"
    with pytest.raises(NotAcceptable):
        negotiate_json(parse_accept("application/dicom+xml"))


def test_one_table_labels_and_negotiates():
    """PS3.18 Table 8.7.3-5: HTJ2K is image/jphc, RLE image/dicom-rle (the x- names
    accepted, never used as labels), unknown compressed syntaxes are never octet-stream."""
    from dicomweb_server.dicom.media_types import pixel_media_type

    htj2k, rle, unknown = "1.2.840.10008.1.2.4.201", "1.2.840.10008.1.2.5", "1.2.3.4.5"
    assert pixel_media_type(htj2k) == "image/jphc"
    assert pixel_media_type(rle) == "image/dicom-rle"
    assert pixel_media_type(ELE) == "application/octet-stream"
    assert pixel_media_type(unknown) is None
    star = parse_accept("multipart/related; type=application/octet-stream; transfer-syntax=*")
    c = negotiate_frames(star, htj2k, no)
    assert (c.media_type, c.transfer_syntax) == ("image/jphc", htj2k)
    c = negotiate_frames(parse_accept("multipart/related; type=image/x-dicom-rle"), rle, no)
    assert (c.media_type, c.transfer_syntax) == ("image/dicom-rle", rle)
    c = negotiate_frames(parse_accept("image/*"), htj2k, yes)
    assert c.media_type == "image/jphc"
    for accept in (star, parse_accept("*/*")):
        with pytest.raises(NotAcceptable):
            negotiate_frames(accept, unknown, no)
    with pytest.raises(NotAcceptable):
        negotiate_frames(parse_accept("multipart/related; type=image/jph"), htj2k, yes)
    with pytest.raises(NotAcceptable, match="video"):
        negotiate_frames(parse_accept("*/*"), "1.2.840.10008.1.2.4.102", yes)


def test_bulkdata_negotiation():
    from dicomweb_server.dicom.media_types import negotiate_bulkdata

    assert negotiate_bulkdata(parse_accept("application/octet-stream")) is True
    assert negotiate_bulkdata(parse_accept(None)) is False
    assert negotiate_bulkdata(parse_accept("text/html, multipart/related; type=application/octet-stream")) is False
    for bad in ("text/html", "*/*;q=0", "foo"):
        with pytest.raises(NotAcceptable):
            negotiate_bulkdata(parse_accept(bad))


# --- accept / charset query parameters (PS3.18 8.3.3.1, 8.3.3.2) ------------------------------

def test_accept_parameter_takes_the_place_of_the_header():
    from dicomweb_server.dicom.media_types import accept_parameter

    got = accept_parameter(['image/png;q=0.5,multipart/related; type="image/jpeg"'], "image/*, multipart/*")
    assert [(r.type, r.params, r.q) for r in got] == [
        ("multipart/related", {"type": "image/jpeg"}, 1.0), ("image/png", {}, 0.5)]
    assert [r.type for r in accept_parameter(["application/dicom+json"], None)] == ["application/dicom+json"]
    got = accept_parameter(["multipart/related;+type=application/dicom;+transfer-syntax=*"], "*/*")
    assert got[0].params == {"type": "application/dicom", "transfer-syntax": "*"}


def test_accept_parameter_errors():
    import pytest

    from dicomweb_server.dicom.media_types import BadNegotiationParameter, accept_parameter

    for values, header in ((["*/*"], None), (["image/*"], None), (["text"], None), ([""], None),
                           (["image/png"], "image/jpeg"), (["application/dicom, image/jpeg"], None),
                           (['multipart/related; type="application/dicom+json", text/html'], None)):
        with pytest.raises(BadNegotiationParameter):
            accept_parameter(values, header)


def test_charset_parameter():
    import pytest

    from dicomweb_server.dicom.media_types import BadNegotiationParameter, charset_parameter

    charset_parameter(["utf-8"])
    charset_parameter(["ISO-8859-1;q=0.9, UTF8"])
    for bad in ("*", "latin1", "utf-8;q=0", "no-such-set", ""):
        with pytest.raises(BadNegotiationParameter):
            charset_parameter([bad])


def test_transcoding_negotiation():
    """With ``can_produce`` (policy/transcode.py): a named syntax, or a compressed media
    type's Table 8.7.3-5 default (D), is produced from the stored one; a lossy syntax
    only when named; what cannot be produced stays 406; the stored syntax wins when it
    belongs to the media type asked."""
    jls, j2k, j2k_lossy, htj2k, htj2k_rpcl = ("1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.90",
                                              "1.2.840.10008.1.2.4.91", "1.2.840.10008.1.2.4.201",
                                              "1.2.840.10008.1.2.4.202")
    made = {jls, j2k, j2k_lossy, htj2k, JPEG, "1.2.840.10008.1.2"}

    def can_produce(_stored, ts):
        return ts in made

    c = negotiate_instances(parse_accept(f"application/dicom; transfer-syntax={j2k}"), ELE, yes, True, can_produce)
    assert (c.transfer_syntax, c.transcode, c.multipart) == (j2k, True, False)
    c = negotiate_instances(parse_accept("multipart/related; type=application/dicom"), jls, yes, False, can_produce)
    assert (c.transfer_syntax, c.transcode, c.defaulted) == (ELE, True, True)  # never lossy by default
    with pytest.raises(NotAcceptable):
        negotiate_instances(parse_accept(f"application/dicom; transfer-syntax={htj2k_rpcl}"), ELE, yes, True,
                            can_produce)
    frames = {
        'multipart/related; type="image/jp2"': ("image/jp2", j2k, True),
        'multipart/related; type="image/jphc"': ("image/jphc", htj2k, True),
        f'multipart/related; type="image/jp2"; transfer-syntax={j2k_lossy}': ("image/jp2", j2k_lossy, True),
        'multipart/related; type="image/jls"': ("image/jls", jls, False),  # as stored
    }
    for accept, want in frames.items():
        c = negotiate_frames(parse_accept(accept), jls, yes, can_produce)
        assert (c.media_type, c.transfer_syntax, c.transcode) == want, accept
    for accept in ('multipart/related; type="image/jpeg"',  # default .70: not produced
                   f'multipart/related; type="image/jphc"; transfer-syntax={htj2k_rpcl}',
                   f'multipart/related; type="image/jp2"; transfer-syntax={jls}',  # not an image/jp2 syntax
                   'multipart/related; type="image/jp2"; transfer-syntax=*'):
        with pytest.raises(NotAcceptable):
            negotiate_frames(parse_accept(accept), ELE, yes, can_produce)
