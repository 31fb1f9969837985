"""``--blob-delivery x-accel``: nginx sends the blob, cmh decides what and to whom.

cmh answers a download with the Hub's headers and ``X-Accel-Redirect:
{prefix}{repo folder}/blobs/{etag}``; nginx, in front of cmh, serves that file
from an ``internal`` location (clients cannot ask for it directly), Range included.
When cmh answers a client's ``Range`` with the whole body (an ``If-Range`` that does not
name the file, a resume after a cut body), the redirect goes to the same path under
:func:`whole_prefix` instead, a location that ignores ``Range`` (``max_ranges 0``): nginx
never sends a part of a file that cmh decided to send whole.
nginx drops most upstream headers on an internal redirect, so the location puts
cmh's back (``$upstream_http_*``) and turns off its own ETag.

:func:`nginx_server` writes the ``server`` block this needs; the README and
``docs/object-storage.md`` show it, and the tests and ``bench/scaleout.py`` run it.
"""

from __future__ import annotations

from pathlib import Path

from .._delivery import whole_prefix

DEFAULT_PREFIX = "/_cmh_blobs/"
#: cmh's headers that nginx must put back on the file it sends.
PASSED_HEADERS = (
    "X-Repo-Commit", "ETag", "X-Linked-Etag", "X-Linked-Size", "Content-Disposition",
)  # fmt: skip


def nginx_location(store: Path, prefix: str = DEFAULT_PREFIX) -> str:
    """The internal ``location`` that serves a local store's blobs for cmh, and the one
    under :func:`whole_prefix` that serves them without ranges."""
    lines = []
    for at, ranges in ((prefix, True), (whole_prefix(prefix), False)):
        lines += [
            f"location {at} {{",
            "  internal;",
            f"  alias {store.resolve()}/;",
            "  etag off;",
            *([] if ranges else ["  max_ranges 0;"]),
            "  default_type application/octet-stream;",
            *(
                f"  add_header {h} $upstream_http_{h.lower().replace('-', '_')} always;"
                for h in PASSED_HEADERS
                if h != "Content-Disposition"  # nginx keeps this one itself
            ),
            "}",
        ]
    return "\n".join(lines)


def nginx_server(store: Path, listen: str, upstream: str, prefix: str = DEFAULT_PREFIX) -> str:
    """A ``server`` block: everything to cmh at ``upstream`` (``host:port``), blobs by nginx."""
    location = "\n".join("  " + line for line in nginx_location(store, prefix).splitlines())
    return (
        "server {\n"
        f"  listen {listen};\n"
        "  location / {\n"
        f"    proxy_pass http://{upstream};\n"
        "    proxy_set_header Host $http_host;\n"
        "    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n"
        "    proxy_http_version 1.1;\n"
        '    proxy_set_header Connection "";\n'
        "  }\n"
        f"{location}\n"
        "}\n"
    )
