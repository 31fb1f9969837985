"""``cmh mirror add|ls|scrub`` and ``cmh serve``: manage and serve a mirror store."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cmh import plural

from ._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_UNREADABLE,
    EXIT_USAGE,
    check_hub_url,
    echo,
    emit_json,
    envelope,
    fail,
    handle_errors,
    human_bytes,
    iso_utc,
    json_option,
    late_progress_bar,
    progress_bar,
    report_waits,
    status_word,
    usage_error,
    warn,
)
from ._interrupt import stop_on_interrupt
from ._options import (
    count_option,
    duration_option,
    file_option,
    flag_option,
    repo_type_option,
    seconds_option,
    trust_origin_option,
    url_option,
)
from ._store_location import STORE, StoreLocation, open_store_or_fail, store_exit_status

if TYPE_CHECKING:
    from cmh.hub.mirror import UpstreamConfig
    from cmh.hub.mirror.stores import SyncResult

STORE_OPTION = click.option(
    "--store",
    required=True,
    type=STORE,
    help="Store folder (stock Hugging Face cache layout), or s3://BUCKET/PREFIX.",
)


@click.group()
def mirror() -> None:
    """Manage a mirror store: import folders, list repos, scrub blobs, sync from a Hub."""


@mirror.command("add")
@click.argument("src_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@STORE_OPTION
@click.option("--repo", "repo_id", required=True, help="Repo id, ORG/NAME or NAME.")
@click.option("--revision", default="main", show_default=True, help="Branch or tag to move.")
@repo_type_option("Import as a model or a dataset repo.")
@json_option
@handle_errors
def add(
    src_dir: Path, store: StoreLocation, repo_id: str, revision: str, repo_type: str, as_json: bool
) -> None:
    """Import SRC_DIR as a new commit of a repo (nothing new if unchanged)."""
    from cmh.hub.mirror import (
        ConditionalWritesUnsupported,
        InvalidNameError,
        StoreError,
        scan_folder,
    )

    snapshot = _hub_cache_snapshot(src_dir)
    resume = "blobs stored so far are kept; run the same command again to finish the import"
    target = open_store_or_fail(store, existing=False)  # a folder store is created
    target.on_notice = warn  # a writer waiting on a pruner's lease says so
    try:
        total = sum(p.stat().st_size for _, p in scan_folder(src_dir))
        with (
            stop_on_interrupt(resume),
            progress_bar(total, repo_id, passes=("hash", "store")) as advance,
        ):
            result = target.add_folder(
                src_dir, repo_id, revision=revision, repo_type=repo_type, progress=advance
            )
    except StoreError as exc:
        code = store_exit_status(
            exc, usage=(InvalidNameError, ConditionalWritesUnsupported), otherwise=EXIT_CHECK_FAILED
        )
        if (
            code == EXIT_CHECK_FAILED
            and snapshot is not None
            and "symlink points outside" in str(exc)
        ):
            fail(
                f"{src_dir} is a snapshot folder of a Hugging Face cache: its files are links "
                f"into {snapshot}. Import a plain folder instead, e.g. "
                f"`cp -rL {src_dir} ./model && cmh mirror add ./model ...`, or copy "
                "the cache folder itself as a store (it already has the store layout)",
                EXIT_USAGE,
            )
        fail(str(exc), code)
    for name, expired_at in _expired_stamps(src_dir):
        warn(
            f"{name}: its stamp expired {iso_utc(expired_at)}: clients of the mirror see it "
            "expired (the resolver asks the mirror again at every load); restamp the folder "
            f"and add it again: cmh stamp {src_dir} --ttl 30d"
        )
    if as_json:
        emit_json(
            envelope("mirror add", **{**result.to_dict(), "ok": True, "exit_status": EXIT_OK})
        )
        return
    if result.created:
        what = "new commit"
    elif result.ref_moved:  # a commit an import to another revision wrote (same tree, parent)
        what = "existing commit, no new commit"
    else:
        what = "unchanged, no new commit"
    echo(
        f"{result.repo_type} {result.repo_id}@{result.revision} -> {result.commit} ({what}); "
        f"{plural(result.files, 'file')}, {human_bytes(result.total_bytes)}, "
        f"{plural(result.new_blobs, 'new blob')} ({human_bytes(result.new_bytes)})"
    )


def _expired_stamps(folder: Path) -> list[tuple[str, int]]:
    """``(file, expired at)`` of the folder's safetensors files whose stamp has expired
    (headers only; a file that cannot be read was refused by the import already)."""
    import time

    from cmh.hub.mirror import scan_folder

    from cmh import CMHError, inspect

    now, out = time.time(), []
    for name, path in scan_folder(folder):
        if not str(name).endswith(".safetensors"):
            continue
        try:
            record = inspect(path).record
        except (CMHError, OSError):
            continue
        if record is not None and record.expires_at and record.expires_at <= now:
            out.append((str(name), record.expires_at))
    return out


def _hub_cache_snapshot(folder: Path) -> Path | None:
    """The ``blobs`` folder when ``folder`` is ``.../models--org--name/snapshots/<commit>``."""
    resolved = folder.resolve()
    repo = resolved.parent.parent
    if resolved.parent.name == "snapshots" and repo.name.split("--")[0] in (
        "models",
        "datasets",
        "spaces",
    ):
        return repo / "blobs"
    return None


TOKENS_HELP = "Tokens file: private repos and the bearer tokens that open them."


@mirror.command("ls")
@STORE_OPTION
@file_option(
    "--tokens",
    "The tokens file of `cmh serve`: mark private repos, warn about names the store lacks.",
)
@json_option
@handle_errors
def ls(store: StoreLocation, tokens: Path | None, as_json: bool) -> None:
    """List the repos of a store, their refs and sizes."""
    from cmh.hub.mirror import (
        AccessPolicy,
        StoreUnavailable,
        TokensFileError,
        load_tokens,
        repo_key,
        unserved_grants,
    )

    policy: AccessPolicy | None = None
    if tokens is not None:
        try:
            policy = load_tokens(tokens)
        except TokensFileError as exc:
            fail(f"--tokens {exc}", EXIT_USAGE)
    opened = open_store_or_fail(store)
    try:
        repos = opened.list_store()
        grants = unserved_grants(policy, opened.repos()) if policy is not None else []
    except StoreUnavailable as exc:
        fail(str(exc), EXIT_UNREADABLE)
    for grant in grants:
        warn(grant.message)

    def private(repo_type: str, repo_id: str) -> bool | None:
        return None if policy is None else repo_key(repo_type, repo_id) in policy.private

    try:
        stamps = _stamp_states(opened, repos)
    except StoreUnavailable as exc:
        fail(str(exc), EXIT_UNREADABLE)
    if as_json:
        documents = []
        for r in repos:
            document: dict[str, Any] = {**r.to_dict(), "private": private(r.repo_type, r.repo_id)}
            ref_documents: list[dict[str, Any]] = document.get("refs", [])
            for ref_document in ref_documents:
                key = (r.repo_type, r.repo_id, ref_document["commit"])
                ref_document["stamp"] = stamps.get(key)
            documents.append(document)
        emit_json(
            envelope(
                "mirror ls",
                ok=True,
                exit_status=EXIT_OK,
                repos=documents,
                warnings=[g.to_dict() for g in grants],
            )
        )
        return
    if not repos:
        echo("(empty store)")
    for r in repos:
        prefix = "" if r.repo_type == "model" else f"{r.repo_type}s/"
        mark = "  (private)" if private(r.repo_type, r.repo_id) else ""
        echo(f"{prefix}{r.repo_id}  {plural(r.blobs, 'blob')}, {human_bytes(r.blob_bytes)}{mark}")
        for ref in r.refs:
            files = plural(ref.files, "file")
            state = stamps.get((r.repo_type, r.repo_id, ref.commit))
            words = f", {_stamp_words(state)}" if state else ""
            echo(f"  {ref.name:<20} {ref.commit}  {files}, {human_bytes(ref.bytes)}{words}")


def _stamp_states(opened: Any, repos: list[Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The stamp state of every listed commit (its weights' headers, as the pages read them):
    ``(type, repo, commit) -> {state, stamped, safetensors, expires_at, expired}``."""
    import time

    from cmh.hub.mirror.web import StampCache, stamp_state

    cache, now, out = StampCache(), time.time(), {}
    for r in repos:
        for ref in r.refs:
            key = (r.repo_type, r.repo_id, ref.commit)
            index = opened.resolve(r.repo_type, r.repo_id, ref.commit) if key not in out else None
            if index is None:
                continue
            state = stamp_state(opened, index, cache, now)
            out[key] = {
                "state": state.label, "stamped": state.stamped, "safetensors": state.safetensors,
                "expires_at": state.expires_at, "expired": state.expired,
            }  # fmt: skip
    return out


def _stamp_words(state: dict[str, Any]) -> str:
    """``stamped, expires 2027-01-01``, ``expired 2026-11-30``, ``unstamped``, ..."""
    from ._common import iso_utc

    label = str(state["state"])
    if state["expires_at"] and label in ("stamped", "expired", "partly stamped"):
        day = iso_utc(state["expires_at"])[:10]
        return f"expired {day}" if state["expired"] else f"{label}, expires {day}"
    return label


_SCRUB_RESUME = "nothing was changed beyond the blobs already reported; run the same command again"


@mirror.command("scrub")
@STORE_OPTION
@flag_option("--full", "Kept for compatibility: every blob is always hashed whole.")
@click.option("--no-quarantine", is_flag=True, help="Report bad blobs without moving them.")
@click.option(
    "--threads",
    type=click.IntRange(1, 64),
    default=None,
    help="Hashing threads (default: one per CPU this process may use, at most 8; "
    "twice that, 2 to 8, for a bucket store).",
)
@json_option
@handle_errors
def scrub(
    store: StoreLocation, full: bool, no_quarantine: bool, threads: int | None, as_json: bool
) -> None:
    """Re-check every blob against its name; quarantine bad ones.

    Exit 1 if a blob is bad, else 3 if one is an invalid safetensors file or
    cannot be read, else 0.
    """
    from cmh.hub.mirror import StoreUnavailable

    opened = open_store_or_fail(store)
    try:
        with (
            stop_on_interrupt(_SCRUB_RESUME),
            progress_bar(opened.scrub_bytes(), "scrub") as advance,
        ):
            report = opened.scrub(
                do_quarantine=not no_quarantine, full=full, threads=threads, progress=advance
            )
    except StoreUnavailable as exc:
        fail(str(exc), EXIT_UNREADABLE)
    if report.bad:
        code = EXIT_CHECK_FAILED
    elif report.errors:
        code = EXIT_UNREADABLE
    else:
        code = EXIT_OK
    if as_json:
        emit_json(
            envelope(
                "mirror scrub", **{**report.to_dict(), "ok": code == EXIT_OK, "exit_status": code}
            )
        )
    else:
        echo(f"checked {plural(len(report.checks), 'blob')}, {human_bytes(report.bytes_checked)}")
        for c in report.bad:
            where = f" -> quarantined to {c.quarantined_to}" if c.quarantined_to else ""
            tensors = f" (tensors: {', '.join(c.bad_tensors[:5])})" if c.bad_tensors else ""
            echo(f"{status_word('BAD')} {c.repo} blob {c.blob}: {c.message}{tensors}{where}")
        for c in report.errors:
            echo(f"{status_word('ERROR')} {c.repo} blob {c.blob}: {c.error}: {c.message}")
        for link in report.broken_links:
            echo(f"unsafe or dangling snapshot entry (not served): {link}")
    raise click.exceptions.Exit(code)


@dataclass(frozen=True)
class _ServeOptions:
    """The options of ``cmh serve`` as click passes them."""

    store: StoreLocation
    host: str
    port: int
    tokens: Path | None
    workers: int
    access_log: Path | None
    public_url: str | None
    max_connections: int | None
    header_timeout: float
    idle_timeout: float
    min_send_rate: int
    upstream: str | None
    upstream_token_file: Path | None
    public_upstream_repos: bool
    fresh_for: int
    stale_if_error: int
    fill_lease_ttl: float | None
    fleet_key_file: Path | None
    admin_tokens: Path | None
    keys: tuple[Path, ...]
    blob_delivery: str
    ref_ttl: float
    graceful_timeout: float
    public_storage_url: str | None
    trusted_proxies: tuple[str, ...]
    tree_page_size: int


@click.command("serve")
@STORE_OPTION
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface; :: every IPv6 one).",
)
@count_option("--port", 0, 65535, 8080, "TCP port (0: a free one, printed at start).")
@file_option("--tokens", TOKENS_HELP)
@count_option(
    "--workers",
    1,
    64,
    1,
    "Worker processes sharing the port (about one per core for heavy traffic).",
)
@file_option("--access-log", "Append JSON access-log lines here (default: stderr).", exists=False)
@click.option(
    "--public-url",
    default=None,
    help="URL clients reach the mirror by, for links it sends (default: the bound address).",
)
@count_option(
    "--max-connections",
    1,
    1_000_000,
    None,
    "Open connections per worker (default: 1000, or what the open-file limit allows).",
)
@seconds_option(
    "--header-timeout",
    20.0,
    "Seconds a client may take to send a request's headers.",
    positive=True,
)
@seconds_option(
    "--idle-timeout", 30.0, "Seconds an idle (keep-alive) connection stays open.", positive=True
)
@count_option(
    "--min-send-rate",
    1,
    10_000_000,
    128,
    "KiB/s a client must take a response body at on average: each body may take 60 s plus "
    "its size at this rate, then the connection is cut (a client that stopped reading).",
)
@url_option(
    "--upstream",
    "Pull-through: fill what the store lacks from this Hub (huggingface.co or a mirror).",
)
@file_option(
    "--upstream-token-file",
    "File holding the mirror's own token for the upstream (gated or private repos).",
)
@click.option(
    "--public-upstream-repos",
    is_flag=True,
    default=False,
    help="Serve repos the upstream marks private or gated to anyone (default: only to tokens "
    "that --tokens grants them).",
)
@duration_option(
    "--fresh-for", "5m", "How long a branch stays fresh after a revalidation (unstamped files)."
)
@duration_option(
    "--stale-if-error",
    "1d",
    "How long past freshness stale content is served when the upstream fails.",
)
@click.option(
    "--fill-lease-ttl",
    type=float,
    default=None,
    metavar="SECONDS",
    callback=lambda ctx, param, value: _fill_lease_ttl(value),
    help=(
        "Bucket stores, with --upstream: seconds a replica's lease on a blob it fills lives "
        "without renewal (renewed every quarter of it); a dead replica's fill is taken over, "
        "and cmh prune removes its parts, after it. Every replica of a bucket should use the "
        "same. Default: 30 (2 to 3600)."
    ),
)
@click.option(
    "--fleet-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="CMH_FLEET_KEY_FILE",
    help=(
        "Bucket stores: file holding the fleet's secret (make one with `openssl rand -hex 32`), "
        "the same on every replica. Also CMH_FLEET_KEY_FILE, which cmh prune and mirror "
        "add|sync|scrub read too. The records replicas share in the bucket are signed with it, "
        "and one not signed with it is ignored."
    ),
)
@file_option(
    "--admin-tokens", "File of admin tokens (one a line): they open the web operator page."
)
@click.option(
    "--key",
    "keys",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Trusted public key (PEM) or folder of keys: web pages check signatures. Repeatable.",
)
@click.option(
    "--blob-delivery",
    type=click.Choice(["proxy", "redirect", "x-accel"]),
    default="proxy",
    show_default=True,
    help="proxy: cmh sends the bytes (sendfile, or streamed from the bucket); redirect: "
    "302 to a presigned URL (bucket stores); x-accel: nginx sends the file named in "
    "X-Accel-Redirect (from the folder, or from the bucket's storage).",
)
@seconds_option(
    "--ref-ttl",
    2.0,
    (
        "Bucket stores: seconds a replica trusts a ref it read (a new commit is "
        "served by every replica at most this long after it is added)."
    ),
)
@seconds_option(
    "--graceful-timeout",
    2.0,
    "On SIGTERM or Ctrl-C: seconds requests in flight get to finish before the server stops.",
)
@url_option(
    "--public-storage-url",
    (
        "Bucket stores, --blob-delivery redirect: the storage endpoint as clients reach it "
        "(when it differs from the one the replicas use); redirects are signed for it."
    ),
)
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    metavar="ADDRESS",
    help=(
        "A reverse proxy (IP address or network, e.g. 127.0.0.1) whose X-Forwarded-For names "
        "the client, for the per-client limits; without it the header is ignored. Repeatable."
    ),
)
@click.option("--tree-page-size", type=click.IntRange(1, 10000), default=1000, hidden=True)
@trust_origin_option()
@handle_errors
def serve(**options: Any) -> None:
    """Serve a store through the Hub HTTP API and web pages.

    SIGTERM or Ctrl-C stops it cleanly: no new connection is taken, requests in
    flight get --graceful-timeout seconds to finish.
    """
    opt = _ServeOptions(**options)
    from cmh.hub.mirror import ServeConfig, ServeError, StoreError, UpstreamConfig
    from cmh.hub.mirror import serve as run
    from cmh.hub.prune import StorePreview

    if opt.upstream is not None:  # options that need --upstream: refused before any look
        pass
    elif opt.upstream_token_file is not None:
        usage_error("--upstream-token-file needs --upstream")
    elif opt.public_upstream_repos:
        usage_error("--public-upstream-repos needs --upstream")
    elif opt.fill_lease_ttl is not None:
        usage_error("--fill-lease-ttl needs --upstream (it is the lease of a pull-through fill)")
    _use_fleet_key(opt)
    pull = None
    check_hub_url(opt.upstream, "--upstream")
    if opt.upstream is not None:
        pull = UpstreamConfig(
            opt.upstream,
            _read_token(opt.upstream_token_file, "--upstream-token-file"),
            float(opt.fresh_for),
            float(opt.stale_if_error),
            public_repos=opt.public_upstream_repos,
            fill_lease_ttl=opt.fill_lease_ttl,
        )
        target = open_store_or_fail(opt.store, existing=False)
        try:  # the store refuses what it cannot do, before anything is made
            target.pull_through(pull.fresh_for, fill_lease_ttl=pull.fill_lease_ttl)
        except StoreError as exc:
            usage_error(f"--fill-lease-ttl: {exc}")
        target.create()  # a pull-through cache starts empty
        click.echo(_exposure(pull, opt.tokens), err=True)
    else:  # as `mirror ls`: no such store exits 2, its storage unreachable 3
        open_store_or_fail(opt.store)

    def announce(url: str) -> None:
        click.echo(f"Serving {opt.store} on {url} ({plural(opt.workers, 'worker')})")
        sys.stdout.flush()

    # Every option named like a ServeConfig field is that field; the rest are read above.
    same = {f.name for f in dataclasses.fields(ServeConfig)} & set(options)
    config = ServeConfig(
        **{name: getattr(opt, name) for name in same - {"upstream"}},
        page_size=opt.tree_page_size, upstream=pull, announce=announce, warn=warn,
        prune_preview=StorePreview(opt.store),  # the operator page's dry runs of prune
    )  # fmt: skip
    try:
        code = run(config)
    except ServeError as exc:
        usage_error(str(exc))
    raise click.exceptions.Exit(code)


def _use_fleet_key(opt: _ServeOptions) -> None:
    """Check ``--fleet-key-file`` and name it to every worker (``CMH_FLEET_KEY_FILE``, read
    where a bucket store is opened); without it, a fleet (a bucket with --upstream) is
    warned that its records are not authenticated."""
    from cmh.hub.mirror import FLEET_KEY_ENV, FleetKeyError, read_fleet_key

    bucket = str(opt.store).startswith("s3://")
    if opt.fleet_key_file is None:
        os.environ.pop(FLEET_KEY_ENV, None)  # an empty CMH_FLEET_KEY_FILE: no key
        if bucket and opt.upstream is not None:
            warn(
                "WARNING: no --fleet-key-file: the fleet's records in the bucket (fill leases "
                "and failures, cuts, access, validations) are not authenticated, so anyone "
                "who can write to the bucket can forge them (docs/object-storage.md)"
            )
        return
    if not bucket:
        usage_error("--fleet-key-file applies to bucket stores (s3://...)")
    try:
        read_fleet_key(opt.fleet_key_file)
    except FleetKeyError as exc:
        usage_error(f"--fleet-key-file: {exc}")
    os.environ[FLEET_KEY_ENV] = str(opt.fleet_key_file.resolve())


#: Bounds of ``--fill-lease-ttl``: the holder renews every quarter of it, and the storage
#: dates each renewal to the whole second (a lease's age may read up to a second too old,
#: spec/hub-mirror.md 8.6), so below 2 s a live lease would be judged by its rounding; a
#: dead replica's fill waits this long (and that second) before another takes it over.
FILL_LEASE_TTL_RANGE = (2.0, 3600.0)


def _fill_lease_ttl(value: float | None) -> float | None:
    """``--fill-lease-ttl``, checked (a clear usage error, exit 2, when out of range)."""
    low, high = FILL_LEASE_TTL_RANGE
    if value is None:
        return None
    if not low <= value <= high:  # also NaN
        raise click.BadParameter(
            f"{value:g} seconds is not a lease lifetime: give {low:g} to {high:g} seconds "
            "(default 30; the holder renews the lease every quarter of it, and a dead "
            "replica's fill is taken over after it)"
        )
    return value


def _exposure(pull: UpstreamConfig, tokens: Path | None) -> str:
    """The start-up line saying what a pull-through mirror exposes of the upstream."""
    via = "the upstream token" if pull.token else "no upstream token"
    if pull.public_repos:
        return (
            f"WARNING: pull-through from {pull.url} ({via}) with --public-upstream-repos: "
            "repos the upstream marks private or gated are served to anyone"
        )
    private = "repos the upstream marks private or gated"
    if tokens is None:
        return (
            f"pull-through from {pull.url} ({via}): public upstream repos are served to anyone; "
            f"{private} are served to nobody (no --tokens file grants them)"
        )
    return (
        f"pull-through from {pull.url} ({via}): public upstream repos are served to anyone; "
        f"{private} only to tokens that {tokens} grants them"
    )


def _read_token(path: Path | None, option: str) -> str | None:
    """The token in the token file ``option`` names (first non-empty line), or ``None``
    without a file; a usage error for a file that is not a small regular text file."""
    if path is None:
        return None
    from cmh import read_small_file

    try:
        lines = [line.strip() for line in read_small_file(path).decode("utf-8").splitlines()]
    except OSError as exc:
        usage_error(f"{option} {path}: cannot read the token file ({exc.strerror or exc})")
    except UnicodeDecodeError as exc:
        usage_error(f"{option} {path}: cannot read the token file ({exc})")
    token = next((line for line in lines if line), "")
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        usage_error(f"{option} {path}: the token file must hold one token on its first line")
    return token


@mirror.command("sync")
@click.argument("repo_ids", metavar="REPO...", nargs=-1, required=True)
@STORE_OPTION
@click.option("--from", "upstream", required=True, metavar="URL", help="The Hub to fill from.")
@click.option("--revision", default="main", show_default=True, help="Branch, tag or commit.")
@repo_type_option("Kind of the repos named.")
@file_option("--token-file", "File holding the token for the upstream (gated or private repos).")
@click.option(
    "--public-upstream-repos",
    is_flag=True,
    help="Serve repos the upstream reads only with --token-file to anyone (default: they "
    "are kept private, opened by a `cmh serve --tokens` grant).",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="For a bucket store: the local Hugging Face cache each repo is resolved into "
    "before its import, kept between runs (a sync again asks the Hub what changed and "
    "fetches only that; an interrupted one resumes). Default: "
    "$XDG_CACHE_HOME/cmh/sync/DIGEST (~/.cache when unset; DIGEST names the bucket URL). "
    "A folder store is its own cache: it ignores this.",
)
@trust_origin_option()
@json_option
@handle_errors
def sync(repo_ids: tuple[str, ...], store: StoreLocation, as_json: bool, **source: Any) -> None:
    """Fill a store from a Hub ahead of time, with the resolver's checks (for air gaps).

    A sync again asks the Hub what changed and fetches only that; one interrupted
    (Ctrl-C, a lost connection) resumes when run again.
    """
    import functools

    from cmh.hub.cache import LayoutError
    from cmh.hub.mirror import (
        ConditionalWritesUnsupported,
        InvalidNameError,
        StoreError,
        needs_upstream_token,
        record_upstream_access,
    )
    from cmh.hub.mirror.stores import SyncRequest

    src = _SyncSource(**source)
    revision, repo_type = src.revision, src.repo_type
    check_hub_url(src.upstream, "--from")
    token = _read_token(src.token_file, "--token-file")
    target = open_store_or_fail(store, existing=False)
    results = []
    resume = (
        "repos reported synced are complete, finished files and chunks of the one in progress "
        "are kept; run the same command again to resume"
    )
    for repo_id in repo_ids:
        try:
            with (
                stop_on_interrupt(resume),
                report_waits(),
                late_progress_bar(f"sync {repo_id}", show=not as_json) as bar,
            ):
                # Recorded before the repo is visible, lifted only once it synced.
                needs = token is not None and needs_upstream_token(src.upstream, repo_type, repo_id)
                private = needs and not src.public_upstream_repos
                if private:
                    record_upstream_access(target, repo_type, repo_id, private=True)
                fetch = functools.partial(_sync_one, src, token, repo_id, bar)
                res = target.sync(SyncRequest(fetch, repo_id, revision, repo_type, src.cache_dir))
                if not private:
                    record_upstream_access(target, repo_type, repo_id, private=False)
        except (LayoutError, InvalidNameError) as exc:
            usage_error(f"{repo_id}@{revision}: {exc}")
        except StoreError as exc:
            usage = (ConditionalWritesUnsupported,)
            fail(str(exc), store_exit_status(exc, usage=usage, otherwise=EXIT_CHECK_FAILED))
        results.append((res, needs, private))
        if not as_json:
            echo(f"{repo_id}@{revision}: {_sync_words(res)}")
            if needs:
                echo(f"{repo_id}: {_access_words(private)}")
    if as_json:
        repos = [
            {**r.to_json(), "needs_token": needs, "private": private}
            for r, needs, private in results
        ]
        emit_json(envelope("mirror sync", ok=True, exit_status=EXIT_OK, repos=repos))


def _access_words(private: bool) -> str:
    """What a sync made of a repo the upstream reads only with the token."""
    if private:
        return (
            "kept private: the upstream serves it only with the token (an access record in "
            "the store; a `cmh serve --tokens` grant opens it; --public-upstream-repos "
            "serves it to anyone)"
        )
    return "served to anyone (--public-upstream-repos), though the upstream asks a token"


def _sync_words(res: SyncResult) -> str:
    """What a sync did, in a person's words: the resolve, then the store."""
    from cmh.hub.mirror.stores import UNCHANGED

    from ._pull_command import outcome_words

    done = outcome_words(res.resolution)
    if res.store == UNCHANGED:
        return f"{done}; the store held it already (nothing written)"
    if res.new_blobs is None:  # resolved in place
        return done
    uploaded = human_bytes(res.new_bytes or 0)
    return f"{done}; imported: {plural(res.new_blobs, 'new blob')} ({uploaded}) uploaded"


@dataclass(frozen=True)
class _SyncSource:
    """Where `mirror sync` fetches from, what, and the bucket's local cache (the options
    click gives beside the repos, the store and ``--json``)."""

    upstream: str
    revision: str
    repo_type: str
    token_file: Path | None
    cache_dir: Path | None
    public_upstream_repos: bool


def _sync_one(
    source: _SyncSource, token: str | None, repo_id: str, bar: Any, cache: Path
) -> object:
    """Resolve one repo from ``source.upstream`` into the cache folder ``cache``."""
    import cmh.hub as hub

    return hub.resolve(
        repo_id,
        source.revision,
        repo_type=source.repo_type,
        cache_dir=cache,
        endpoint=source.upstream,
        token=token or False,
        policy=hub.Policy(stale_if_error=False),
        progress=bar.advance,
        on_total=bar.on_total,
    )
