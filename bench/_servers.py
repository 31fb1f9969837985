"""Starting and stopping the servers a benchmark measures: one way for every script."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "hub"))
from processes import free_port, stop_process

__all__ = ["free_port", "nginx_config", "stop_process"]


def nginx_config(tmp: Path, workers: int, access_log: bool, servers: str) -> str:
    """An nginx.conf for a run in ``tmp`` (pid, logs and temp folders there, in the
    foreground, sendfile on) whose ``http`` block holds ``servers``."""
    user = "user root;\n" if os.geteuid() == 0 else ""
    log = f"{tmp}/access.log" if access_log else "off"
    return (
        f"{user}daemon off;\nworker_processes {workers};\npid {tmp}/nginx.pid;\n"
        f"error_log {tmp}/error.log;\nevents {{ worker_connections 1024; }}\n"
        f"http {{\n  access_log {log};\n  sendfile on;\n  tcp_nopush on;\n"
        f"  client_body_temp_path {tmp}/body;\n  proxy_temp_path {tmp}/proxy;\n"
        f"  fastcgi_temp_path {tmp}/fastcgi;\n  uwsgi_temp_path {tmp}/uwsgi;\n"
        f"  scgi_temp_path {tmp}/scgi;\n  default_type application/octet-stream;\n"
        f"{servers}}}\n"
    )
