"""A throw-away S3-compatible server for the tests: moto's server (``moto[server]``,
in-memory buckets) on 127.0.0.1 and a free port, in a thread of the test process, with
a log of the requests it answered (method, path, Range header, status) so tests can
assert how the archive talked to it.

What this does not prove (docs/scale-out.md): durability (moto keeps objects in
memory), the consistency of a distributed store (moto is one process: every read sees
the last write), multi-part upload limits, Content-MD5 checking (moto accepts a wrong
one), throttling and the latencies of a real network.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from dataclasses import dataclass

#: credentials and region the archive reads from the standard AWS variables (moto accepts any)
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # /bucket/key (path-style addressing)
    range: str | None
    if_none_match: str | None
    content_md5: str | None
    status: int


class _Recorder:
    """WSGI middleware: every request answered, in order."""

    def __init__(self, app) -> None:
        self.app = app
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        def start(status, headers, exc_info=None):
            # recorded before any byte of the answer is sent: a client never sees an
            # answer whose request is not in the log yet
            with self._lock:
                self.requests.append(Request(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                                             environ.get("HTTP_RANGE"), environ.get("HTTP_IF_NONE_MATCH"),
                                             environ.get("HTTP_CONTENT_MD5"), int(status.split()[0])))
            return start_response(status, headers, exc_info)

        return self.app(environ, start)


class S3Server:
    """moto's S3 in a thread; ``url`` is its endpoint."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        for k, v in AWS_ENV.items():
            os.environ[k] = v  # the archive (in this process and its children) reads these
        self.recorder = _Recorder(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", 0, self.recorder, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.client = self.new_client()

    def new_client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, **{
            "aws_access_key_id": AWS_ENV["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            "region_name": AWS_ENV["AWS_DEFAULT_REGION"]})

    def fresh_bucket(self) -> str:
        """A new, empty bucket's name."""
        name = f"test-{secrets.token_hex(6)}"
        self.client.create_bucket(Bucket=name)
        return name

    @property
    def requests(self) -> list[Request]:
        return list(self.recorder.requests)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for p in pages for o in p.get("Contents", ()))

    def get(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)


def storage_settings(server: S3Server) -> dict:
    """Archive settings that keep instances in a new, empty bucket of ``server``."""
    return {"storage": f"s3://{server.fresh_bucket()}/archive", "s3_endpoint_url": server.url}


def _client_for(storage: dict):
    import boto3

    from dicomweb_server.store.s3 import parse_storage_url

    bucket, prefix = parse_storage_url(storage["storage"])
    client = boto3.client("s3", endpoint_url=storage["s3_endpoint_url"], region_name=AWS_ENV["AWS_DEFAULT_REGION"],
                          aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"])
    return client, bucket, prefix


def instance_keys(storage: dict) -> list[str]:
    """Keys of the ``.dcm`` objects under the prefix of ``storage`` (settings from
    :func:`storage_settings`), relative to the prefix."""
    client, bucket, prefix = _client_for(storage)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"][len(prefix):] for p in pages for o in p.get("Contents", ()) if o["Key"].endswith(".dcm"))


def instance_object(storage: dict, key: str) -> bytes:
    """The bytes of the object ``key`` (relative to the prefix of ``storage``)."""
    client, bucket, prefix = _client_for(storage)
    return client.get_object(Bucket=bucket, Key=prefix + key)["Body"].read()
