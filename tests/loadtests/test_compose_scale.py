"""docker-compose.scale.yml without a Docker engine: the file is checked (services,
health checks, dependencies, the nginx config it mounts), then the same commands run
here as local processes: Debian's PostgreSQL (tests/postgres.py) in place of the
``postgres`` service, a moto S3 server (tests/s3server.py) in place of MinIO, the two
archive nodes' command lines with their environment, and Debian's nginx with
docker/nginx-scale.conf. Instances are stored through nginx and read from each node
directly.

What is substituted, and nothing else: the image's programs with this Python; the
service addresses (``archive-N:8080``, ``minio:9000``, the database URL) and the
published and internal ports with local ones; the named volumes with temporary
folders; nginx's pid, log and temp paths (a non-root run). What this does not prove:
the images themselves (postgres:15, MinIO, nginx:alpine, the archive image built from
the Dockerfile), Docker's networking and health-check scheduling, MinIO's behaviour
(moto stands in for it: see tests/s3server.py), and anything about two machines.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from tests.helpers import stop_processes, free_port, make_dataset, multipart, to_bytes
from tests.loadtests.test_compose_commands import PROGRAMS, ROOT, _dockerfile, _start, _wait_healthy
from tests.s3server import AWS_ENV
from tests.server.test_sample_files import split_multipart

NODES = ["archive-1", "archive-2"]
WHOLE = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.scale.yml").read_text())


def test_compose_file_names_every_part_with_health_checks():
    compose = _compose()
    services = compose["services"]
    assert list(services) == ["postgres", "minio", "bucket", *NODES, "nginx"]
    for name in ("postgres", "minio", *NODES, "nginx"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    for name in NODES:
        node = services[name]
        assert node["build"] == "." and node["image"].startswith("dicomweb-archive")
        assert node["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                      "bucket": {"condition": "service_completed_successfully"}}
        env = node["environment"]
        assert env["DICOMWEB_INDEX"] == "postgresql" and env["DICOMWEB_STORAGE"].startswith("s3://dicomweb/")
        assert env["DICOMWEB_S3_ENDPOINT_URL"] == "http://minio:9000"
        assert node["volumes"] == [f"{name}-data:/data"]  # a spool of its own: nothing shared on disk
    assert services["bucket"]["depends_on"] == {"minio": {"condition": "service_healthy"}}
    nginx = services["nginx"]
    assert nginx["depends_on"] == {n: {"condition": "service_healthy"} for n in NODES}
    assert nginx["volumes"] == ["./docker/nginx-scale.conf:/etc/nginx/nginx.conf:ro"]
    assert nginx["ports"] == ["127.0.0.1:8080:8080"]  # published on loopback only
    conf = (ROOT / "docker" / "nginx-scale.conf").read_text()
    assert re.findall(r"^\s*server (\S+) ", conf, re.M) == [f"{n}:8080" for n in NODES]
    assert "proxy_request_buffering off;" in conf and "proxy_buffering off;" in conf
    assert "client_max_body_size 4g;" in conf


def _value(text: str, shell: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: shell.get(m[1], m[2]), text)


def _nginx_conf(tmp: Path, ports: dict[str, int], listen: int) -> Path:
    """docker/nginx-scale.conf with local addresses and the paths of a non-root run."""
    conf = (ROOT / "docker" / "nginx-scale.conf").read_text()
    for name, port in ports.items():
        conf = conf.replace(f"server {name}:8080 ", f"server 127.0.0.1:{port} ")
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{listen};")
    temp = "".join(f"    {kind}_temp_path {tmp}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                           "scgi"))
    conf = conf.replace("http {\n", "http {\n" + temp, 1)
    path = tmp / "nginx.conf"
    path.write_text(conf)
    return path


def test_scale_out_as_local_processes(tmp_path, postgres, s3_server):
    from tests.peers.static_tree import nginx_path

    compose = _compose()
    services = compose["services"]
    shell = {"ARCHIVE_WORKERS": "1"}
    image_env, _cmd = _dockerfile()
    # the bucket service's job (mc mb), on the local S3 server
    bucket = services[NODES[0]]["environment"]["DICOMWEB_STORAGE"].split("/")[2]
    if bucket not in [b["Name"] for b in s3_server.client.list_buckets()["Buckets"]]:
        s3_server.client.create_bucket(Bucket=bucket)
    database_url = postgres.fresh_url()
    ports = {name: free_port() for name in NODES}
    procs: list[subprocess.Popen] = []
    try:
        for name in NODES:
            svc = services[name]
            dimse = str(free_port())

            def local(text: str) -> str:
                text = _value(text, shell)
                text = text.replace("127.0.0.1:8080", f"127.0.0.1:{ports[name]}")
                return {"8080": str(ports[name]), "11112": dimse, "/data": str(tmp_path / f"{name}-data")}.get(
                    text, text)

            argv = [local(a) for a in svc["command"]]
            argv = PROGRAMS[argv[0]] + argv[1:]
            env = {**os.environ, **{k: local(v) for k, v in image_env.items()}}
            env.update({k: _value(str(v), shell) for k, v in svc["environment"].items()})
            env["DICOMWEB_DATABASE_URL"] = database_url  # postgres:5432 -> the local server (own schema)
            env["DICOMWEB_S3_ENDPOINT_URL"] = s3_server.url  # minio:9000 -> the local S3 server
            env.update({k: AWS_ENV[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
            log = tmp_path / f"{name}.log"
            proc = _start(argv, env, log)
            procs.append(proc)
            health = [local(a) for a in svc["healthcheck"]["test"][1:]]
            _wait_healthy(proc, PROGRAMS[health[0]] + health[1:], env, log)

        nginx_dir = tmp_path / "nginx"
        nginx_dir.mkdir()
        listen = free_port()
        conf = _nginx_conf(nginx_dir, ports, listen)
        glob = f"daemon off; pid {nginx_dir}/nginx.pid;" + (" user root;" if os.geteuid() == 0 else "")
        nginx = subprocess.Popen([nginx_path(), "-p", str(nginx_dir), "-e", str(nginx_dir / "error.log"), "-c",
                                  str(conf), "-g", glob], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        procs.append(nginx)
        front = f"http://127.0.0.1:{listen}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(front + "/studies?limit=1", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert nginx.poll() is None, (nginx_dir / "error.log").read_text()[-2000:]
            assert time.monotonic() < deadline, (nginx_dir / "error.log").read_text()[-2000:]
            time.sleep(0.2)

        # store through the load balancer: round robin spreads the requests over both nodes
        study = make_dataset().StudyInstanceUID
        datasets = [make_dataset(study=study, PatientID="SCALE", InstanceNumber=i) for i in range(6)]
        with httpx.Client(base_url=front, timeout=60) as lb:
            for pair in (datasets[0:2], datasets[2:4], datasets[4:6]):
                body, ctype = multipart([to_bytes(ds) for ds in pair])
                r = lb.post("/studies", content=body, headers={"Content-Type": ctype})
                assert r.status_code == 200, r.text
        stored_by = []
        for name in NODES:  # read from each node directly
            with httpx.Client(base_url=f"http://127.0.0.1:{ports[name]}", timeout=60) as node:
                found = node.get(f"/studies/{study}/instances").json()
                assert sorted(x["00080018"]["Value"][0] for x in found) == sorted(d.SOPInstanceUID for d in datasets)
                for ds in datasets:
                    url = f"/studies/{study}/series/{ds.SeriesInstanceUID}/instances/{ds.SOPInstanceUID}"
                    [(_h, data)] = split_multipart(node.get(url, headers=WHOLE))
                    assert data == to_bytes(ds)
                metrics = node.get("/metrics").text
                stored_by.append(float(re.search(r"^dicomweb_instances_stored_total (\S+)$", metrics, re.M)[1]))
        assert sum(stored_by) == 6 and min(stored_by) > 0, stored_by  # both nodes stored some
        prefix = services[NODES[0]]["environment"]["DICOMWEB_STORAGE"].split("/", 3)[3]
        keys = s3_server.keys(bucket, prefix + "/" + study + "/")
        assert len(keys) == 6  # one object per instance, in the bucket both nodes share
    finally:
        stop_processes(procs)
