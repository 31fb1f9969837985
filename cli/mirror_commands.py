"""``cmh mirror add|ls|scrub`` and ``cmh serve``: manage and serve a mirror store."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    JSON_SCHEMA_VERSION,
    echo,
    emit_json,
    fail,
    handle_errors,
    human_bytes,
    json_option,
    progress_bar,
    usage_error,
)

STORE_OPTION = click.option(
    "--store",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Store folder (stock Hugging Face cache layout).",
)


@click.group()
def mirror() -> None:
    """Manage a mirror store: import folders, list repos, scrub blobs."""


@mirror.command("add")
@click.argument("src_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@STORE_OPTION
@click.option("--repo", "repo_id", required=True, help="Repo id, ORG/NAME or NAME.")
@click.option("--revision", default="main", show_default=True, help="Branch or tag to move.")
@click.option(
    "--repo-type",
    type=click.Choice(["model", "dataset"]),
    default="model",
    show_default=True,
)
@json_option
@handle_errors
def add(
    src_dir: Path, store: Path, repo_id: str, revision: str, repo_type: str, as_json: bool
) -> None:
    """Import SRC_DIR as a new commit of a repo (nothing new if unchanged)."""
    from cmh.hub.mirror import InvalidNameError, StoreError, add_folder, scan_folder

    try:
        total = sum(p.stat().st_size for _, p in scan_folder(src_dir))
        with progress_bar(total * 2, f"import {repo_id}") as advance:
            result = add_folder(
                store, src_dir, repo_id, revision=revision, repo_type=repo_type, progress=advance
            )
    except InvalidNameError as exc:
        fail(str(exc), EXIT_USAGE)
    except StoreError as exc:
        fail(str(exc), EXIT_CHECK_FAILED)
    if as_json:
        emit_json({"schema": JSON_SCHEMA_VERSION, **result.to_dict()})
        return
    what = "new commit" if result.created else "unchanged, no new commit"
    echo(
        f"{result.repo_type} {result.repo_id}@{result.revision} -> {result.commit} ({what}); "
        f"{result.files} files, {human_bytes(result.total_bytes)}, "
        f"{result.new_blobs} new blobs ({human_bytes(result.new_bytes)})"
    )


@mirror.command("ls")
@STORE_OPTION
@json_option
@handle_errors
def ls(store: Path, as_json: bool) -> None:
    """List the repos of a store, their refs and sizes."""
    from cmh.hub.mirror import list_store

    if not store.is_dir():
        fail(f"{store}: store folder not found", EXIT_USAGE)
    repos = list_store(store)
    if as_json:
        emit_json({"schema": JSON_SCHEMA_VERSION, "repos": [r.to_dict() for r in repos]})
        return
    if not repos:
        echo("(empty store)")
    for r in repos:
        prefix = "" if r.repo_type == "model" else f"{r.repo_type}s/"
        echo(f"{prefix}{r.repo_id}  {r.blobs} blobs, {human_bytes(r.blob_bytes)}")
        for ref in r.refs:
            echo(f"  {ref.name:<20} {ref.commit}  {ref.files} files, {human_bytes(ref.bytes)}")


@mirror.command("scrub")
@STORE_OPTION
@click.option("--full", is_flag=True, help="Hash whole files even when a CMH manifest exists.")
@click.option("--no-quarantine", is_flag=True, help="Report bad blobs without moving them.")
@click.option("--threads", type=click.IntRange(1, 64), default=None, help="Hashing threads.")
@json_option
@handle_errors
def scrub(store: Path, full: bool, no_quarantine: bool, threads: int | None, as_json: bool) -> None:
    """Re-check every blob against its name; quarantine bad ones (exit 1 if any)."""
    from cmh.hub.cache import iter_repos
    from cmh.hub.mirror import scrub_store

    if not store.is_dir():
        fail(f"{store}: store folder not found", EXIT_USAGE)
    total = 0
    for repo in iter_repos(store):
        if repo.blobs.is_dir():
            total += sum(p.stat().st_size for p in repo.blobs.iterdir() if p.is_file())
    with progress_bar(total, "scrub") as advance:
        report = scrub_store(
            store, do_quarantine=not no_quarantine, full=full, threads=threads, progress=advance
        )
    from cmh.hub.mirror.scrub_history import record_scrub

    record_scrub(store, report.to_dict())  # shown on the web operator page
    if as_json:
        emit_json({"schema": JSON_SCHEMA_VERSION, **report.to_dict()})
    else:
        echo(f"checked {len(report.checks)} blobs, {human_bytes(report.bytes_checked)}")
        for c in report.bad:
            where = f" -> quarantined to {c.quarantined_to}" if c.quarantined_to else ""
            tensors = f" (tensors: {', '.join(c.bad_tensors[:5])})" if c.bad_tensors else ""
            echo(f"BAD {c.repo} blob {c.blob}: {c.message}{tensors}{where}")
        for link in report.broken_links:
            echo(f"unsafe or dangling snapshot entry (not served): {link}")
    raise click.exceptions.Exit(EXIT_CHECK_FAILED if report.bad else EXIT_OK)


@click.command("serve")
@STORE_OPTION
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option(
    "--tokens",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Tokens file: private repos and the bearer tokens that open them.",
)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option(
    "--access-log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append JSON access-log lines here (default: stderr).",
)
@click.option(
    "--admin-tokens",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="File of admin tokens (one a line): they open the web operator page.",
)
@click.option(
    "--key",
    "keys",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Trusted public key (PEM) or folder of keys: web pages check signatures. Repeatable.",
)
@click.option("--tree-page-size", type=click.IntRange(1, 10000), default=1000, hidden=True)
@handle_errors
def serve(
    store: Path,
    host: str,
    port: int,
    tokens: Path | None,
    workers: int,
    access_log: Path | None,
    admin_tokens: Path | None,
    keys: tuple[Path, ...],
    tree_page_size: int,
) -> None:
    """Serve a store through the Hub HTTP API and web pages (stops cleanly on SIGTERM)."""
    from cmh.hub.mirror import ServeConfig, ServeError
    from cmh.hub.mirror import serve as run

    def announce(url: str) -> None:
        plural = "s" if workers > 1 else ""
        click.echo(f"Serving {store} on {url} ({workers} worker{plural})")
        sys.stdout.flush()

    config = ServeConfig(
        store=store,
        host=host,
        port=port,
        tokens=tokens,
        workers=workers,
        access_log=access_log,
        page_size=tree_page_size,
        admin_tokens=admin_tokens,
        keys=keys,
        announce=announce,
    )
    try:
        code = run(config)
    except ServeError as exc:
        usage_error(str(exc))
    raise click.exceptions.Exit(code)
