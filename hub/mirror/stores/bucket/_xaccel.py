"""``--blob-delivery x-accel`` on a bucket store: nginx moves the bytes from the storage,
cmh decides what and to whom.

cmh answers a download with the Hub's headers, ``X-Accel-Redirect: {prefix}`` and two
headers for nginx alone: ``X-Cmh-Storage-Target``, the path and query of a presigned
GET URL of the blob object (valid :data:`SIGNED_FOR`), and ``X-Cmh-Storage-Etag``, the
storage ETag of the object version cmh checked. nginx, in front of cmh, follows the
redirect to an ``internal`` location (clients cannot ask for it directly) that proxies
that URL to the storage, with the client's ``Range`` and ``If-Match`` on the checked
version: an object replaced after the check answers ``412``, which nginx turns into a
``503``, never into another version's bytes. The bytes go storage to nginx to client,
never through Python.

nginx drops most upstream headers on an internal redirect, and the storage's answer has
its own ``ETag``: the location keeps cmh's headers in variables before it proxies
(``set`` runs before the new upstream replaces the old one) and puts them back.

:func:`nginx_bucket_server` writes the ``server`` block this needs. By default its
location reads the storage through nginx's cache, slice by slice: each slice once for
the clients that want it at once, keyed by the object and its checked version, so that
clients of one blob at once cost the storage about one read of it, not one each;
``cache=None`` streams each body unbuffered on a GET of its own, with no disk at all;
``docs/object-storage.md`` shows it, and the tests and ``bench/scaleout.py`` run it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .._delivery import whole_prefix

DEFAULT_PREFIX = "/_cmh_bucket/"
#: Response headers cmh gives nginx (never seen by clients: nginx does not pass them).
TARGET_HEADER = "X-Cmh-Storage-Target"
VERSION_HEADER = "X-Cmh-Storage-Etag"
#: cmh's headers that nginx must put back on the storage's answer.
PASSED_HEADERS = (
    "X-Repo-Commit", "ETag", "X-Linked-Etag", "X-Linked-Size", "Content-Disposition",
)  # fmt: skip
#: The client's headers the storage must not see (its own auth, conditions on cmh's ETag).
DROPPED_REQUEST_HEADERS = (
    "Authorization", "Cookie", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since",
    "If-Range",
)  # fmt: skip
#: The storage's headers a client must not see (its ETag is not the Hub's).
HIDDEN_RESPONSE_HEADERS = (
    "ETag", "Last-Modified", "Server", "x-amz-request-id", "x-amz-id-2", "Content-Disposition",
)  # fmt: skip

#: Headers nginx would obey in the storage's answer (a redirect, a rate, caching): ignored.
STORAGE_INSTRUCTIONS = (
    "X-Accel-Redirect", "X-Accel-Expires", "X-Accel-Limit-Rate", "X-Accel-Buffering",
    "X-Accel-Charset", "Expires", "Cache-Control", "Set-Cookie", "Vary",
)  # fmt: skip


def _variable(header: str) -> str:
    return header.lower().replace("-", "_")


def storage_origin(endpoint: str) -> tuple[str, str]:
    """``(scheme://host:port, host:port)`` of a storage endpoint URL."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) storage endpoint: {endpoint!r}")
    return f"{parts.scheme}://{parts.netloc}", parts.netloc


#: The cache zone of :func:`nginx_bucket_cache` and the size of each cached slice.
CACHE_ZONE = "cmh_blobs"
#: The folder of nginx's cache that :func:`nginx_bucket_server` writes by default (nginx
#: creates it; its workers must be able to write it).
DEFAULT_CACHE = "/var/cache/nginx/cmh"
SLICE = "8m"


def nginx_bucket_cache(folder: str, max_size: str = "10g") -> str:
    """The ``http``-level lines a cached bucket location needs: the cache in ``folder`` (at
    most ``max_size``; an entry unused for an hour goes) and the object's path taken from
    cmh's target (the cache key's, without the signature's query)."""
    return (
        f"proxy_cache_path {folder} levels=1:2 keys_zone={CACHE_ZONE}:16m "
        f"max_size={max_size} inactive=60m use_temp_path=off;\n"
        "map $cmh_target $cmh_object {\n"
        '  "~^(?<cmh_path>[^?]*)" $cmh_path;\n'
        "}\n"
    )


def _cached() -> list[str]:
    """A cached location's lines: the storage is read in slices, each fetched once for
    every client that wants it at the same time (the others wait for it) and kept, keyed
    by the object and its checked version (never by the ETag alone: two objects may
    share an MD5)."""
    return [
        f"  slice {SLICE};",
        f"  proxy_cache {CACHE_ZONE};",
        '  proxy_cache_key "$cmh_object $cmh_version $slice_range";',
        "  proxy_set_header Range $slice_range;",
        "  proxy_cache_valid 206 60m;",
        "  proxy_cache_lock on;",
        "  proxy_cache_lock_timeout 60s;",
        "  proxy_cache_lock_age 60s;",
        "  proxy_buffering on;",
        "  proxy_buffer_size 1m;",
        "  proxy_buffers 8 1m;",
        "  proxy_busy_buffers_size 2m;",
    ]


def _unbuffered() -> list[str]:
    # each read of up to 1 MiB from the storage goes to the client before the next (16
    # clients, one run: SeaweedFS spent 0.75 CPU s per GiB serving nginx buffering 4 x 1
    # MiB ahead, 0.63-0.68 unbuffered, 0.46-0.52 serving the clients directly); never a
    # temp file (the sizes below only apply to an answer that turns buffering back on)
    return [
        "  proxy_buffering off;",
        "  proxy_max_temp_file_size 0;",
        "  proxy_buffer_size 1m;",
        "  proxy_buffers 4 1m;",
        "  proxy_busy_buffers_size 2m;",
    ]


#: Statuses nginx can intercept (``error_page`` takes 300-599 but 499, nginx's own "client
#: closed the request", which no storage sends), per ``error_page`` line.
_INTERCEPTED = [code for code in range(300, 600) if code != 499]
_PER_LINE = 25


def _refusals() -> list[str]:
    """Every storage answer but the bytes (``200``, ``206``) becomes cmh's ``503``: deny by
    default, so that no status, body (it names the bucket's keys) or ``Location`` of the
    storage reaches a client (``416`` for an empty object's slice, ``302``, ``429``...)."""
    codes = [str(code) for code in _INTERCEPTED]
    return [
        f"  error_page {' '.join(codes[i : i + _PER_LINE])} =503 @cmh_storage_unavailable;"
        for i in range(0, len(codes), _PER_LINE)
    ]


def nginx_bucket_location(storage: str, prefix: str = DEFAULT_PREFIX, cached: bool = True) -> str:
    """The internal ``location`` (and its named error location) that fetches a bucket
    store's blobs from ``storage`` (the S3 endpoint cmh signs for) on cmh's behalf, and
    the one under :func:`whole_prefix` that sends them whole whatever the client's
    ``Range``; ``cached`` (the default): through the cache of :func:`nginx_bucket_cache`
    (which the ``http`` block must hold), else unbuffered."""
    origin, host = storage_origin(storage)
    kept = [f"  set $cmh_{_variable(h)} $upstream_http_{_variable(h)};" for h in PASSED_HEADERS]
    lines = []
    for at, ranges in ((prefix, True), (whole_prefix(prefix), False)):
        whole = [] if ranges else ["  max_ranges 0;"]  # the client's Range: not applied
        if not ranges and not cached:
            whole.append('  proxy_set_header Range "";')  # nor sent to the storage
        lines += [
            f"location {at} {{",
            "  internal;",
            *kept,
            f"  set $cmh_target $upstream_http_{_variable(TARGET_HEADER)};",
            f"  set $cmh_version $upstream_http_{_variable(VERSION_HEADER)};",
            f"  proxy_pass {origin}$cmh_target;",
            f"  proxy_set_header Host {host};",
            "  proxy_set_header If-Match $cmh_version;",
            *(f'  proxy_set_header {h} "";' for h in DROPPED_REQUEST_HEADERS),
            "  proxy_http_version 1.1;",
            '  proxy_set_header Connection "";',
            *(_cached() if cached else _unbuffered()),
            *whole,
            # the storage's answer is bytes, never an instruction to nginx
            f"  proxy_ignore_headers {' '.join(STORAGE_INSTRUCTIONS)};",
            *(f"  proxy_hide_header {h};" for h in HIDDEN_RESPONSE_HEADERS),
            *(f"  add_header {h} $cmh_{_variable(h)} always;" for h in PASSED_HEADERS),
            "  proxy_intercept_errors on;",
            *_refusals(),
            *(["  proxy_ssl_server_name on;"] if origin.startswith("https:") else []),
            "}",
        ]
    lines += [
        "location @cmh_storage_unavailable {",
        '  if ($cmh_target = "") { return 404; }  # asked for directly: not a redirect of cmh',
        "  add_header Retry-After 60 always;",
        '  return 503 "blob unavailable from the storage\\n";',
        "}",
    ]
    return "\n".join(lines)


def nginx_bucket_server(
    listen: str,
    upstream: str,
    storage: str,
    prefix: str = DEFAULT_PREFIX,
    cache: str | None = DEFAULT_CACHE,
) -> str:
    """A ``server`` block (for nginx's ``http`` block): everything to cmh at ``upstream``
    (``host:port``), blobs by nginx from the storage at ``storage``, read through a cache
    in the folder ``cache`` (the lines of :func:`nginx_bucket_cache` come first);
    ``cache=None``: unbuffered, each body on a GET of its own, nothing on disk."""
    lines = nginx_bucket_location(storage, prefix, cached=cache is not None).splitlines()
    location = "\n".join("  " + line for line in lines)
    return (
        (nginx_bucket_cache(cache) if cache is not None else "") + "server {\n"
        f"  listen {listen};\n"
        "  location / {\n"
        f"    proxy_pass http://{upstream};\n"
        "    proxy_set_header Host $http_host;\n"
        "    proxy_http_version 1.1;\n"
        '    proxy_set_header Connection "";\n'
        "    proxy_buffering off;\n"
        "  }\n"
        f"{location}\n"
        "}\n"
    )


def accel_headers(
    presigned_url: str, storage_etag: str, prefix: str = DEFAULT_PREFIX
) -> dict[str, str]:
    """The headers that hand a body to nginx: the redirect (to ``prefix``, or to its
    :func:`whole_prefix` for a body cmh sends whole) and what its location needs."""
    parts = urlsplit(presigned_url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return {"X-Accel-Redirect": prefix, TARGET_HEADER: target, VERSION_HEADER: storage_etag}
