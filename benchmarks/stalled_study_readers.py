"""Stalled whole-study readers vs RLIMIT_NOFILE: N sockets send a study GET and never
read; then an ordinary client asks QIDO-RS and the study. Run with a code tree on
PYTHONPATH; the server is started under prlimit --nofile=400:400."""
import os, socket, subprocess, sys, tempfile, time
import httpx
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.helpers import make_dataset, multipart, to_bytes

tree, port = sys.argv[1], int(sys.argv[2])  # usage: stalled_study_readers.py CODE_TREE PORT
data = tempfile.mkdtemp(prefix="attack_fd_")
env = dict(os.environ, PYTHONPATH=tree)
srv = subprocess.Popen(["prlimit", "--nofile=400:400", sys.executable, "-m", "dicomweb_server.cli", "serve",
                        "--port", str(port), "--data-dir", data, "--workers", "1"], env=env,
                       stdout=subprocess.DEVNULL, stderr=open(data + "/server.log", "w"), cwd=data)
base = f"http://127.0.0.1:{port}"
try:
    for _ in range(100):
        try:
            httpx.get(base + "/studies", timeout=1); break
        except httpx.HTTPError:
            time.sleep(0.3)
    first = make_dataset(rows=200, columns=200)
    ds = [first] + [make_dataset(study=first.StudyInstanceUID, series=first.SeriesInstanceUID, rows=200, columns=200)
                    for _ in range(119)]
    body, ctype = multipart([to_bytes(d) for d in ds])
    print("stow", httpx.post(base + "/studies", content=body, headers={"Content-Type": ctype}, timeout=60).status_code,
          "120 instances of", len(to_bytes(first)), "bytes")
    req = (f"GET /studies/{first.StudyInstanceUID} HTTP/1.1\r\nHost: x\r\n"
           'Accept: multipart/related; type="application/dicom"; transfer-syntax=*\r\n\r\n').encode()
    stalled = []
    for i in range(4):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (client side only: a slow reader)
        s.sendall(req)
        stalled.append(s)
        time.sleep(0.5)
    fds = len(os.listdir(f"/proc/{srv.pid}/fd")) if os.path.exists(f"/proc/{srv.pid}/fd") else None
    print("server descriptors with 4 stalled readers:", fds)
    out = []
    for url in ("/studies", f"/studies/{first.StudyInstanceUID}"):
        try:
            r = httpx.get(base + url, headers={"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}
                          if "studies/" in url else {}, timeout=20)
            out.append((url[:20], r.status_code, len(r.content)))
        except httpx.HTTPError as e:
            out.append((url[:20], type(e).__name__))
    print("ordinary client:", out)
    for s in stalled:
        s.close()
finally:
    srv.terminate(); srv.wait(30)
    log = open(data + "/server.log").read()
    print("server log: EMFILE lines:", log.count("Too many open files"), "| 500s:", log.count("unhandled error"))
