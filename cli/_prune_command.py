"""``cmh prune``: remove stale revisions and leftovers from a cache or a mirror store."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    SIZE,
    TIME,
    echo,
    emit_failure,
    emit_json,
    fail,
    handle_errors,
    json_option,
    progress_bar,
    usage_error,
    warn,
)
from ._options import FolderPath, duration_option, flag_option, seconds_option
from ._store_location import STORE, StoreLocation

if TYPE_CHECKING:
    from cmh.hub.prune import ExecuteOptions, PruneTarget


def stdin_is_terminal() -> bool:
    """True when stdin is an interactive terminal (someone can answer a question)."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


@dataclass(frozen=True)
class _PruneOptions:
    """The options of ``cmh prune`` as click passes them."""

    cache_dir: Path | None
    store: StoreLocation | None
    settle: float | None
    expired: bool
    grace: int | None
    include_referenced: bool
    unreferenced: bool
    keep_latest: int | None
    older_than: int | None
    max_size: int | None
    stale_incomplete: int
    at: float | None
    lock_timeout: float
    dry_run: bool
    yes: bool
    as_json: bool


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--cache-dir",
    type=FolderPath(file_okay=False, path_type=Path),
    help="A Hugging Face cache (e.g. ~/.cache/huggingface/hub).",
)
@click.option(
    "--store",
    type=STORE,
    help="A mirror store (same layout), or a bucket store s3://BUCKET/PREFIX.",
)
@seconds_option(
    "--settle",
    None,
    (
        "Seconds to wait, once per run, before deleting, so that writes in flight show in "
        "the second scan (default: 0 on a folder, whose writers hold the repo lock; on a "
        "bucket store, after taking the leases, the writers' window + the S3 client's "
        "longest try, 250 s: lower it only when no import runs)."
    ),
)
@click.option("--expired", is_flag=True, help="Revisions whose stamped files are past expires_at.")
@duration_option("--grace", None, "With --expired: only once expired for this long (e.g. 7d).")
@flag_option("--include-referenced", "With --expired: also revisions a ref points to.")
@click.option("--unreferenced", is_flag=True, help="Revisions no ref points to.")
@click.option(
    "--keep-latest",
    type=click.IntRange(min=0),
    metavar="N",
    help="Keep the N latest revisions of each repo; the older ones go.",
)
@duration_option(
    "--older-than", None, "Revisions not used for this long (recorded use, else snapshot time)."
)
@click.option(
    "--max-size",
    type=SIZE,
    help="Evict least recently used revisions until the whole fits (e.g. 50GB).",
)
@duration_option("--stale-incomplete", "1d", "Age after which an interrupted download is removed.")
@click.option(
    "--at",
    type=TIME,
    help="With --dry-run: judge expiry and age as at this time (e.g. +30d).",
)
@seconds_option("--lock-timeout", 10.0, "Seconds to wait for a busy repo before skipping it.")
@click.option("--dry-run", is_flag=True, help="Show what would go; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before deleting.")
@json_option
@handle_errors
def prune(**options: Any) -> None:
    """Prune stale revisions from a cache or store.

    Policies combine: a revision goes when any of them names it, and the refs
    that name it go with it. Always: orphan blobs, stale *.incomplete files,
    dangling refs, and .no_exist/, trees/ and lock files of what is gone; in a
    bucket store, the parts of pull-through fills whose lease expired.
    Anything touched in the last 10 minutes is left alone. Safe to run while
    the mirror serves and resolvers run: busy repos and revisions in use are
    skipped.
    """
    opt = _PruneOptions(**options)
    if (opt.cache_dir is None) == (opt.store is None):
        usage_error(
            "give exactly one of --cache-dir DIR (e.g. ~/.cache/huggingface/hub) or --store DIR"
        )
    if (opt.grace is not None or opt.include_referenced) and not opt.expired:
        usage_error("--grace and --include-referenced apply to --expired only")
    if opt.at is not None and not opt.dry_run:
        usage_error("--at judges the cache at another time: use it with --dry-run only")
    root = opt.cache_dir if opt.cache_dir is not None else opt.store
    assert root is not None
    kind = "cache" if opt.cache_dir is not None else "store"

    from cmh.hub.prune import ExecuteOptions, NotACacheError, PrunePolicy, plan_prune

    from ._prune_report import plan_document, plan_lines

    policy = PrunePolicy(
        expired=opt.expired,
        grace=float(opt.grace or 0),
        include_referenced=opt.include_referenced,
        unreferenced=opt.unreferenced,
        keep_latest=opt.keep_latest,
        older_than=None if opt.older_than is None else float(opt.older_than),
        max_size=opt.max_size,
        stale_incomplete=float(opt.stale_incomplete),
    )
    target = _open_target(root, store=opt.store is not None)
    try:
        scan = target.scan(policy)
    except NotACacheError as exc:
        fail(str(exc), EXIT_USAGE)
    plan = plan_prune(scan, policy, opt.at, target.clock)

    if opt.dry_run or plan.empty:
        if opt.as_json:
            emit_json(plan_document(plan, kind, opt.dry_run))
        else:
            for line in plan_lines(plan, kind, dry_run=True):
                echo(line)
        return

    if not opt.yes:
        if not stdin_is_terminal():
            usage_error(
                "refusing to delete without --yes: stdin is not a terminal "
                "(use --dry-run to see what would go)"
            )
        for line in plan_lines(plan, kind, dry_run=False):
            click.echo(line, err=opt.as_json)
        if not click.confirm("Delete these?", default=False, err=True):
            click.echo("Kept everything: nothing deleted.", err=True)
            if opt.as_json:
                emit_failure("declined: nothing deleted", EXIT_CHECK_FAILED)
            raise click.exceptions.Exit(EXIT_CHECK_FAILED)
    elif _settles(root, opt.settle) and not opt.as_json:
        for line in plan_lines(plan, kind, dry_run=False):  # what the settle waits to delete
            click.echo(line, err=True)

    with progress_bar(0 if opt.as_json else plan.freed, f"prune {kind}") as advance:
        execution = ExecuteOptions(opt.lock_timeout, opt.settle, progress=advance)
        _execute(target, plan, kind, execution, opt.as_json)


def _settles(root: StoreLocation, settle: float | None) -> bool:
    """True when the run waits before deleting (a bucket by default, a folder if asked)."""
    return settle > 0 if settle is not None else not isinstance(root, Path)


def _open_target(root: StoreLocation, *, store: bool) -> PruneTarget:
    """The cache or store to prune; a bucket that cannot be opened exits 2."""
    from cmh.hub.mirror import BucketError
    from cmh.hub.prune import open_target

    try:
        return open_target(root, store=store, on_notice=lambda text: click.echo(text, err=True))
    except BucketError as exc:
        fail(str(exc), EXIT_USAGE)
    except NotADirectoryError:
        fail(f"{root}: no such directory", 3)


def _execute(
    target: PruneTarget, plan: object, kind: str, options: ExecuteOptions, as_json: bool
) -> None:
    from cmh.hub.mirror import ConditionalWritesUnsupported
    from cmh.hub.prune import PrunePlan

    from ._prune_report import report_document, report_lines

    assert isinstance(plan, PrunePlan)
    try:
        report = target.execute(plan, options)
    except ConditionalWritesUnsupported as exc:
        fail(str(exc), EXIT_USAGE)
    status = EXIT_CHECK_FAILED if report.all_errors else EXIT_OK
    if as_json:
        emit_json(report_document(report, kind, status))
    else:
        for line in report_lines(report, kind):
            echo(line)
    for skipped in report.skipped:
        warn(f"{skipped.repo_id}: {skipped.skipped}")
    if status != EXIT_OK:
        raise click.exceptions.Exit(status)
