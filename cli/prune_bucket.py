"""``cmh prune --store s3://...``: prune a bucket store (see :mod:`cmh.hub.prune.bucket`)."""

from __future__ import annotations

import click

from ._common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    JSON_SCHEMA_VERSION,
    echo,
    emit_json,
    human_bytes,
    usage_error,
    warn,
)
from .store_location import open_bucket_or_fail


def prune_bucket_store(
    url: str,
    policy: object,
    *,
    dry_run: bool,
    yes: bool,
    settle: float | None,
    at: float | None,
    as_json: bool,
    interactive: bool,
) -> None:
    """Plan (dry run) or carry out a prune of a bucket store, and report it."""
    from cmh.hub.prune import PrunePolicy
    from cmh.hub.prune.bucket import UnsupportedPolicy, check_policy, prune_bucket

    assert isinstance(policy, PrunePolicy)
    try:
        check_policy(policy)
    except UnsupportedPolicy as exc:
        usage_error(str(exc))
    store = open_bucket_or_fail(url)
    if not dry_run and not yes:
        if not interactive:
            usage_error(
                "refusing to delete without --yes: stdin is not a terminal "
                "(use --dry-run to see what would go)"
            )
        plan = prune_bucket(store, policy, dry_run=True)
        _report(plan, as_json=False)
        if not click.confirm("Delete these?", default=False, err=True):
            raise click.exceptions.Exit(EXIT_CHECK_FAILED)
    report = prune_bucket(store, policy, dry_run=dry_run, settle=settle, now=at)
    status = EXIT_CHECK_FAILED if report.errors else EXIT_OK
    if as_json:
        emit_json({"schema": JSON_SCHEMA_VERSION, "kind": "bucket", **report.to_dict()})
    else:
        _report(report, as_json)
    for repo in report.repos:
        if repo.skipped:
            warn(f"{repo.repo_id}: {repo.skipped}")
    if status != EXIT_OK:
        raise click.exceptions.Exit(status)


def _report(report: object, as_json: bool) -> None:
    from cmh.hub.prune.bucket import BucketPruneReport

    assert isinstance(report, BucketPruneReport)
    verb = "would free" if report.dry_run else "freed"
    for r in report.repos:
        for commit, reasons in r.commits.items():
            echo(f"{r.repo_id}: revision {commit} ({', '.join(reasons)})")
        if r.refs or r.trees or r.blobs:
            echo(f"{r.repo_id}: {len(r.refs)} refs, {len(r.trees)} trees, {len(r.blobs)} blobs")
        for error in r.errors:
            echo(f"{r.repo_id}: error: {error}")
    echo(f"{report.store}: {verb} {human_bytes(report.freed)}")
