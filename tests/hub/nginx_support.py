"""A real nginx on a free 127.0.0.1 port with its own config and prefix in a tmp folder.

Used by the x-accel tests: nginx in front of ``cmh serve --blob-delivery x-accel``,
configured with :func:`cmh.hub.mirror.stores.local._xaccel.nginx_server` for a local
store, or :func:`cmh.hub.mirror.stores.bucket._xaccel.nginx_bucket_server` for a bucket
store (``storage``: the S3 endpoint the blobs are fetched from). A test is skipped, with a
message saying so, only when nginx is not installed (Debian: ``nginx-light``).
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cmh.hub.mirror.stores.bucket._xaccel import nginx_bucket_server
from cmh.hub.mirror.stores.local._xaccel import nginx_server
from deadline_support import TEST_DEADLINE
from processes import on_a_free_port, start_server, stop_process


def find_nginx() -> str | None:
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )


class Nginx:
    """nginx in front of a cmh server (``upstream`` is ``host:port``) for ``store``: a
    folder, or with ``storage`` (an S3 endpoint URL) a bucket store on that storage (through
    nginx's cache in ``tmp`` with ``cache``)."""

    def __init__(
        self, store: Path | None, upstream: str, tmp: Path, storage: str = "", cache: bool = False
    ) -> None:
        nginx = find_nginx()
        if nginx is None:
            pytest.skip("nginx is not installed (apt-get install nginx-light)")
        tmp.mkdir(parents=True, exist_ok=True)
        self.cached = cache
        self._config = (nginx, store, upstream, tmp, storage)
        self.process = on_a_free_port(self._start)

    def _start(self, port: int) -> subprocess.Popen[bytes]:
        nginx, store, upstream, tmp, storage = self._config
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        user = "user root;\n" if os.geteuid() == 0 else ""
        listen = f"127.0.0.1:{self.port}"
        if storage:
            cached = str(tmp / "cache") if self.cached else None
            server = nginx_bucket_server(listen, upstream, storage, cache=cached)
        else:
            assert store is not None
            server = nginx_server(store, listen, upstream)
        conf = tmp / "nginx.conf"
        conf.write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {tmp}/nginx.pid;\n"
            f"error_log {tmp}/error.log;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n  access_log {tmp}/access.log;\n  sendfile on;\n"
            f"  client_body_temp_path {tmp}/body;\n  proxy_temp_path {tmp}/proxy;\n"
            f"  fastcgi_temp_path {tmp}/fastcgi;\n  uwsgi_temp_path {tmp}/uwsgi;\n"
            f"  scgi_temp_path {tmp}/scgi;\n" + server + "}\n"
        )

        def listening() -> None:  # this nginx, not another server that took the port
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TEST_DEADLINE)
            try:
                conn.request("HEAD", "/health")
                server = conn.getresponse().getheader("Server") or ""
            except http.client.HTTPException as exc:
                raise ConnectionError(f"{self.url}: {exc!r}") from exc
            finally:
                conn.close()
            if not server.startswith("nginx"):
                raise ConnectionError(f"{self.url} is {server or 'another server'}")

        # what nginx says before its error_log is open (a port taken: "bind() ... failed")
        said = tmp / "nginx.out"
        argv = [nginx, "-c", str(conf), "-p", str(tmp)]
        return start_server(argv, said, listening, TEST_DEADLINE)

    def stop(self) -> None:
        stop_process(self.process, grace=5)
