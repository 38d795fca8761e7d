"""docker-compose.yml and the Dockerfile without a Docker engine: every service's command
line, with the image's and the service's environment, runs here as a local process, in
the order ``depends_on`` gives, so a command that cannot start (a refused flag, a missing
option, a wrong module) fails this test rather than a user's ``docker-compose up``.

What is mapped, and nothing else: the image's programs (``dicomweb-server``, ``python``,
``locust``) to this Python; service host names to 127.0.0.1; the published and internal
ports (8080, locust's 5557) to free ones; the named volumes (``/data``, ``/manifests``)
to temporary folders; ``${VAR:-default}`` interpolated from the variables the test sets,
as docker-compose does from the shell. The listen address stays as written (0.0.0.0).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers import stop_processes, free_port

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = {"dicomweb-server": [sys.executable, "-m", "dicomweb_server.cli"], "python": [sys.executable],
            "locust": [sys.executable, "-m", "locust"]}


def _dockerfile() -> tuple[dict[str, str], list[str]]:
    """ENV and CMD of the Dockerfile (the image every service uses)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    cmd: list[str] = []
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(dict(kv.split("=", 1) for kv in shlex.split(line[4:])))
        elif line.startswith("CMD "):
            cmd = json.loads(line[4:])
    return env, cmd


class Mapper:
    """The container world (service names, ports, volumes, programs) mapped onto this machine."""

    def __init__(self, tmp: Path, shell: dict[str, str]) -> None:
        self.shell = shell
        self.ports = {"8080": str(free_port()), "5557": str(free_port())}
        self.volumes = {"/data": str(tmp / "archive-data"), "/manifests": str(tmp / "manifests")}
        for v in self.volumes.values():
            Path(v).mkdir(parents=True, exist_ok=True)

    def value(self, text: str, services: list[str]) -> str:
        text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: self.shell.get(m[1], m[2]), text)
        hosts = "|".join(re.escape(h) for h in [*services, "127.0.0.1", "localhost"])
        text = re.sub(rf"(?<![\w.-])(?:{hosts}):(\d+)\b",
                      lambda m: f"127.0.0.1:{self.ports.get(m[1], m[1])}", text)
        for inside, outside in self.volumes.items():
            if text == inside or text.startswith(inside + "/"):
                text = outside + text[len(inside):]
        return self.ports.get(text, text)

    def command(self, argv: list[str], services: list[str]) -> list[str]:
        argv = [self.value(a, services) for a in argv]
        # the locust master's host name in a worker's command; its port is a free one here
        argv = ["127.0.0.1" if a in services else a for a in argv]
        if argv[0] == "locust" and "--master" in argv:
            argv += ["--master-bind-host", "127.0.0.1", "--master-bind-port", self.ports["5557"]]
        if argv[0] == "locust" and "--worker" in argv:
            argv += ["--master-port", self.ports["5557"]]
        return PROGRAMS.get(argv[0], [argv[0]]) + argv[1:]

    def environment(self, image_env: dict[str, str], service: dict, services: list[str]) -> dict[str, str]:
        env = {k: self.value(v, services) for k, v in image_env.items()}
        given = service.get("environment") or {}
        if isinstance(given, list):  # "- NAME" passes NAME on from the shell when set there
            given = dict(e.split("=", 1) if "=" in e else (e, self.shell.get(e)) for e in given)
        env.update({k: self.value(str(v), services) for k, v in given.items() if v is not None})
        return {**os.environ, **env}


def _start(argv, env, log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def _wait_healthy(proc, healthcheck: list[str], env, log: Path) -> None:
    deadline = time.monotonic() + 60
    while subprocess.run(healthcheck, cwd=ROOT, env=env, capture_output=True).returncode != 0:
        assert proc.poll() is None, f"the archive service exited {proc.returncode}: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"the archive never became healthy: {log.read_text()[-2000:]}"
        time.sleep(0.3)


def test_compose_services_run_as_written(tmp_path):
    if importlib.util.find_spec("locust") is None:
        pytest.fail("the load extra is not installed: pip install -e '.[load]'")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    names = list(services)
    assert names == ["archive", "preload", "locust-master", "locust-worker"], names
    for name, svc in services.items():  # every service runs the image built here
        assert svc.get("build") == "." and svc["image"].startswith("dicomweb-archive"), name
    assert services["preload"]["depends_on"]["archive"]["condition"] == "service_healthy"
    assert services["locust-master"]["depends_on"]["preload"]["condition"] == "service_completed_successfully"
    shell = {"LOAD03_STUDIES": "2", "LOAD03_INSTANCES": "6", "ARCHIVE_WORKERS": "1", "LOCUST_HEADLESS": "true",
             "LOCUST_USERS": "2", "LOCUST_SPAWN_RATE": "2", "LOCUST_RUN_TIME": "3s", "LOCUST_EXPECT_WORKERS": "1"}
    m = Mapper(tmp_path, shell)
    image_env, _cmd = _dockerfile()

    def argv(name):
        svc = services[name]
        return m.command(svc.get("entrypoint", []) + svc.get("command", []), names)

    def env(name):
        return m.environment(image_env, services[name], names)

    procs = []
    try:
        log = tmp_path / "archive.log"
        archive = _start(argv("archive"), env("archive"), log)
        procs.append(archive)
        health = services["archive"]["healthcheck"]["test"]
        assert health[0] == "CMD"
        _wait_healthy(archive, m.command(health[1:], names), env("archive"), log)

        preload = subprocess.run(argv("preload"), cwd=ROOT, env=env("preload"), capture_output=True, text=True,
                                 timeout=300)
        assert preload.returncode == 0, preload.stdout[-2000:] + preload.stderr[-2000:]
        assert "complete" in preload.stdout
        assert (tmp_path / "manifests" / "manifest.json").exists()

        master_log = tmp_path / "master.log"
        master = _start(argv("locust-master"), env("locust-master"), master_log)
        procs.append(master)
        worker = _start(argv("locust-worker"), env("locust-worker"), tmp_path / "worker.log")
        procs.append(worker)
        assert master.wait(timeout=120) == 0, master_log.read_text()[-3000:]
        out = master_log.read_text()
        assert "Aggregated" in out and "QIDO-RS /studies" in out, out[-3000:]
        assert worker.wait(timeout=30) == 0, (tmp_path / "worker.log").read_text()[-2000:]
    finally:
        stop_processes(procs)


def test_dockerfile_command_starts_with_authentication_from_the_environment(tmp_path):
    """The image's CMD with its ENV: refused (exit 2, saying what to set) without
    authentication; started with DICOMWEB_API_KEYS, as the Dockerfile documents."""
    image_env, cmd = _dockerfile()
    assert image_env["DICOMWEB_HOST"] == "0.0.0.0" and cmd[0] == "dicomweb-server"
    m = Mapper(tmp_path, {})
    env = m.environment(image_env, {}, [])
    env = {k: v for k, v in env.items() if k not in ("DICOMWEB_API_KEYS", "DICOMWEB_INSECURE")}
    argv = m.command(cmd, [])
    refused = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "DICOMWEB_API_KEYS" in refused.stderr and "DICOMWEB_INSECURE" in refused.stderr
    docs = (ROOT / "Dockerfile").read_text()
    assert "-e DICOMWEB_API_KEYS=" in docs and "-e DICOMWEB_INSECURE=true" in docs
    env["DICOMWEB_API_KEYS"] = json.dumps({"my-secret-token": ["read", "write", "delete"]})
    env["DICOMWEB_PORT"] = m.ports["8080"]
    log = tmp_path / "server.log"
    proc = _start(argv, env, log)
    url = f"http://127.0.0.1:{m.ports['8080']}/studies"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        assert r.status_code == 401
        r = httpx.get(url, headers={"Authorization": "Bearer my-secret-token"}, timeout=10)
        assert (r.status_code, r.json()) == (200, [])
    finally:
        proc.terminate()
        proc.wait(10)
