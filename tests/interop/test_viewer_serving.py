"""How the archive serves an OHIF build (dicomweb_server/viewer.py), on a small fake
``dist/`` with the same kinds of absolute references as ``@ohif/app``: no npm, no browser."""

from __future__ import annotations

import gzip

import httpx
import pytest

from dicomweb_server import cli, viewer
from dicomweb_server.app import create_app
from dicomweb_server.settings import Settings
from tests.helpers import LiveServer

INDEX = ('<!doctype html><html><head><script>window.PUBLIC_URL="/"</script>'
         '<link rel="manifest" href="/manifest.json"><link href="/app.bundle.css" rel="stylesheet">'
         '<script src="/app-config.js"></script></head><body><div id="root"></div>'
         '<script defer="defer" src="/app.bundle.0f61.js"></script></body></html>')
BUNDLE = ('(() => {\n__webpack_require__.p = "/";\n})();\n'
          'const a = \'/silent-refresh.html\', b = "/dicom-microscopy-viewer/x.min.js", '
          'c = "/not-a-file-of-dist", d = `/assets/${name}`, e = "https://example.org/assets/x.png";\n'
          + "// padding\n" * 200)


@pytest.fixture
def dist(tmp_path):
    d = tmp_path / "dist"
    (d / "assets").mkdir(parents=True)
    (d / "dicom-microscopy-viewer").mkdir()
    (d / "index.html").write_text(INDEX)
    (d / "app.bundle.0f61.js").write_text(BUNDLE)
    (d / "app.bundle.css").write_text("@font-face{src:url(/a34f.woff2) format('woff2')}")
    (d / "a34f.woff2").write_bytes(bytes(range(256)))
    (d / "manifest.json").write_text('{"icons": [{"src": "/assets/icon.png"}]}')
    (d / "assets" / "icon.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (d / "app-config.js").write_text("window.config = {dataSources: ['https://demo.example']};")
    (d / "silent-refresh.html").write_text("<html></html>")
    (d / "dicom-microscopy-viewer" / "x.min.js").write_text("var x;")
    (d / "unchanged.js").write_text("console.log('/nothing/here');")
    return d


class _Archive:
    """The archive with its viewer on a loopback port, and an HTTP client for it."""

    def __init__(self, tmp_path, **settings) -> None:
        self.server = LiveServer(tmp_path / "data", "memory", **settings)

    def __enter__(self) -> httpx.Client:
        self.server.start()
        self.client = httpx.Client(base_url=self.server.url, follow_redirects=False, timeout=30)
        return self.client

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.server.stop()


@pytest.fixture
def client(tmp_path, dist):
    with _Archive(tmp_path, viewer=True, viewer_dir=dist) as c:
        yield c


def test_entry_points_redirect_to_the_viewer_base(client):
    r = client.get("/viewer")
    assert r.status_code == 307 and r.headers["location"] == "/viewer/"
    r = client.get("/viewer?StudyInstanceUIDs=1.2.3")  # OHIF's own study route, under the base
    assert r.status_code == 307 and r.headers["location"] == "/viewer/viewer?StudyInstanceUIDs=1.2.3"


def test_index_is_rewritten_to_the_base(client):
    r = client.get("/viewer/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-cache"
    text = r.text
    assert 'window.PUBLIC_URL="/viewer/"' in text
    for ref in ("/viewer/manifest.json", "/viewer/app.bundle.css", "/viewer/app-config.js",
                "/viewer/app.bundle.0f61.js"):
        assert f'"{ref}"' in text, ref
    assert '"/app.bundle' not in text
    # OHIF's routes (single-page app) answer the same page
    assert client.get("/viewer/viewer?StudyInstanceUIDs=1.2.3").text == text
    assert client.get("/viewer/index.html").text == text


def test_bundles_and_css_are_rewritten_other_files_are_not(client, dist):
    js = client.get("/viewer/app.bundle.0f61.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert '__webpack_require__.p = "/viewer/";' in js.text
    assert "'/viewer/silent-refresh.html'" in js.text
    assert '"/viewer/dicom-microscopy-viewer/x.min.js"' in js.text
    assert '`/viewer/assets/${name}`' in js.text
    assert '"/not-a-file-of-dist"' in js.text  # not an entry of dist/: left alone
    assert '"https://example.org/assets/x.png"' in js.text
    assert "url(/viewer/a34f.woff2)" in client.get("/viewer/app.bundle.css").text
    assert '"/viewer/assets/icon.png"' in client.get("/viewer/manifest.json").text
    assert client.get("/viewer/a34f.woff2").content == bytes(range(256))
    assert client.get("/viewer/unchanged.js").text == "console.log('/nothing/here');"
    assert client.get("/viewer/assets/icon.png").content == b"\x89PNG\r\n\x1a\n"


def test_rewritten_files_carry_etag_and_gzip(client):
    r = client.get("/viewer/app.bundle.0f61.js", headers={"Accept-Encoding": "identity"})
    etag = r.headers["etag"]
    assert "content-encoding" not in r.headers
    with client.stream("GET", "/viewer/app.bundle.0f61.js", headers={"Accept-Encoding": "gzip"}) as s:
        assert s.headers["content-encoding"] == "gzip"
        assert gzip.decompress(b"".join(s.iter_raw())).decode() == r.text
    r = client.get("/viewer/app.bundle.0f61.js", headers={"If-None-Match": etag})
    assert r.status_code == 304


def test_missing_files_and_escapes_are_404(client, dist):
    assert client.get("/viewer/nope.js").status_code == 404
    assert client.get("/viewer/assets/nope.png").status_code == 404
    assert client.get("/viewer/%2e%2e/%2e%2e/etc/passwd").status_code in (404, 200)  # 200 = the app page
    assert "root:" not in client.get("/viewer/%2e%2e/%2e%2e/etc/passwd").text
    files = viewer.ViewerFiles(dist)
    assert files.resolve("../dist/index.html") == (dist / "index.html").resolve()
    assert files.resolve("../../etc/passwd") is None
    assert files.resolve("assets") is None  # a folder


@pytest.mark.parametrize("path", ["/viewer/x%00", "/viewer/%00", "/viewer/app-config.js%00.html"])
def test_a_nul_in_the_path_is_no_server_error(client, dist, path):
    """A NUL named no file but raised ValueError in Path.resolve: 500 (new-user trial)."""
    for method in ("GET", "HEAD"):
        r = client.request(method, path)
        assert r.status_code in (404, 200), (method, path, r.status_code)  # 200 = the app page
        assert b"root:" not in r.content
    assert viewer.ViewerFiles(dist).resolve("app-config.js\0.html") is None


def test_app_config_points_at_the_archive(tmp_path, dist):
    def config(**kw):
        with _Archive(tmp_path, viewer=True, viewer_dir=dist, **kw) as c:
            r = c.get("/viewer/app-config.js")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
            assert c.get(kw.get("prefix", "") + "/studies").status_code == 200  # DICOMweb is still there
            return r.text

    text = config()
    assert 'routerBasename: "/viewer"' in text
    assert 'var root = "" || (window.location.origin + "");' in text
    for key in ("qidoRoot: root", "wadoRoot: root", "qidoSupportsIncludeField: true",
                "imageRendering: 'wadors'", "thumbnailRendering: 'thumbnail'", "staticWado: false",
                "supportsReject: true",
                "'ohif.tours': { $set: [] }", "investigationalUseDialog: { option: 'never' }"):
        assert key in text, key
    assert "demo.example" not in text
    assert '(window.location.origin + "/dicomweb")' in config(prefix="/dicomweb")
    assert 'var root = "https://pacs.example.org/dicomweb" ||' in config(public_url="https://pacs.example.org/dicomweb/")


def test_oidc_login_only_when_a_client_id_is_configured(tmp_path, dist):
    """Without ``oidc_client_id`` (API keys, or an OIDC issuer for API clients only) the
    app-config has no ``oidc`` key at all (OHIF takes even an empty list for a login), no
    silent-callback page (neither the viewer's nor /ui/'s), and /ui/ offers no login; with it,
    OHIF's code-flow entry and one silent-callback page for both (web_login.py)."""
    oidc = {"oidc_issuer": "https://idp.example/realms/x", "oidc_jwks_url": "https://idp.example/jwks"}
    for extra in ({}, {"api_keys": {"k": ["read"]}}, oidc):
        with _Archive(tmp_path, viewer=True, viewer_dir=dist, **extra) as c:
            text = c.get("/viewer/app-config.js").text
            assert "oidc" not in text and "authority" not in text
            assert c.get("/viewer/silent-callback.html").status_code == 404
            assert c.get("/ui/silent-callback.html").status_code == 404
            assert c.get("/viewer/signed-out").text.startswith("<!doctype html>")  # a route of the app
            assert '<meta name="dicomweb-oidc" content="null">' in c.get("/ui/").text
    with _Archive(tmp_path, viewer=True, viewer_dir=dist, oidc_client_id="pages", **oidc) as c:
        text = c.get("/viewer/app-config.js").text
        assert ('    oidc: [{"authority": "https://idp.example/realms/x", "client_id": "pages", "redirect_uri": '
                '"/callback", "silent_redirect_uri": "/silent-callback.html", "post_logout_redirect_uri": '
                '"/signed-out", "response_type": "code", "scope": "openid dicomweb:read dicomweb:write '
                'dicomweb:delete"}],\n') in text
        assert c.get("/viewer/signed-out").headers["location"] == "/viewer/"
        assert "&quot;client_id&quot;: &quot;pages&quot;" in c.get("/ui/").text
        viewer, ui = c.get("/viewer/silent-callback.html"), c.get("/ui/silent-callback.html?code=c&state=s")
        for r in (viewer, ui):
            assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
            assert r.headers["cache-control"] == "no-store" and r.headers["referrer-policy"] == "no-referrer"
            assert ('window.parent.postMessage({source: "oidc-client", url: window.location.href, keepOpen: false},'
                    in r.text and r.text.rstrip().endswith("window.location.origin);</script>\n</body></html>"))
        assert ui.content == viewer.content
    with pytest.raises(ValueError, match="--oidc-client-id needs --oidc-issuer and --oidc-jwks-url"):
        Settings(oidc_client_id="pages", oidc_issuer="https://idp.example")


def test_off_by_default_and_prefix_must_not_collide(tmp_path, dist):
    with _Archive(tmp_path) as c:
        assert c.get("/viewer/").status_code == 404
    with pytest.raises(ValueError, match="collides"):
        create_app(Settings(data_dir=tmp_path / "data", index="memory", viewer=True, viewer_dir=dist,
                            prefix="/viewer"))


async def test_viewer_alone_at_the_root_serves_dist_unchanged(dist):
    from starlette.applications import Starlette

    app = Starlette(routes=viewer.viewer_router(dist, dicomweb_url="http://127.0.0.1:8080", base="/").routes)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://viewer") as c:
        assert (await c.get("/")).text == INDEX
        assert (await c.get("/viewer?StudyInstanceUIDs=1.2.3")).text == INDEX  # OHIF's route at /
        assert (await c.get("/app.bundle.0f61.js")).text == BUNDLE
        config = (await c.get("/app-config.js")).text
        assert 'var root = "http://127.0.0.1:8080" ||' in config and 'routerBasename: "/"' in config


@pytest.fixture
def cli_env(monkeypatch):
    """The serve command exports its settings as DICOMWEB_* variables and re-executes the
    interpreter unless the malloc variables are set: both undone after the test."""
    for k, v in cli._MALLOC_ENV.items():
        monkeypatch.setenv(k, v)
    for name in Settings.model_fields:
        monkeypatch.setenv(f"DICOMWEB_{name.upper()}", "")
        monkeypatch.delenv(f"DICOMWEB_{name.upper()}")  # restored (unset) afterwards
    return monkeypatch


def test_cli_viewer_without_a_build_says_how(tmp_path, cli_env, capsys):
    monkeypatch = cli_env
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: pytest.fail("must not start"))
    rc = cli.main(["--viewer", "--viewer-dir", str(tmp_path / "empty"), "--data-dir", str(tmp_path / "data"),
                   "--index", "memory"])
    assert rc == 2
    assert "viewer install" in capsys.readouterr().err


def test_cli_viewer_flags_reach_the_workers(tmp_path, cli_env, dist):
    seen = {}
    cli_env.setattr("uvicorn.run", lambda *a, **k: seen.update(k))
    assert cli.main(["--viewer", "--viewer-dir", str(dist), "--data-dir", str(tmp_path / "data"),
                     "--index", "memory"]) == 0
    s = Settings()  # what a worker reads from the environment
    assert s.viewer is True and s.viewer_dir == dist


def test_the_viewer_page_when_it_is_off_says_how_to_turn_it_on(tmp_path):
    """Issue 26 item 11: /viewer/ without --viewer was {"detail":"Not Found"}; still 404,
    without credentials (as the viewer's files), as a page saying how to turn it on."""
    from starlette.testclient import TestClient

    with TestClient(create_app(Settings(data_dir=tmp_path, dimse_port=0, api_keys={"k": ["read"]}))) as c:
        for path in ("/viewer/", "/viewer", "/viewer/viewer?StudyInstanceUIDs=1.2.3"):
            r = c.get(path, follow_redirects=False)
            assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), path
            assert "<code>dicomweb-server --viewer</code>" in r.text and "Not Found" not in r.text
