"""Text and ``--json`` renderings of a prune plan and of what a prune did."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._common import envelope, human_bytes, iso_utc

if TYPE_CHECKING:
    from cmh.hub.prune import (
        ItemRemoval,
        PrunePlan,
        PrunePolicy,
        PruneReport,
        RepoOutcome,
        RepoPlan,
        RevisionRemoval,
    )


def policy_document(policy: PrunePolicy) -> dict[str, Any]:
    return {
        "expired": policy.expired,
        "grace_seconds": policy.grace,
        "include_referenced": policy.include_referenced,
        "unreferenced": policy.unreferenced,
        "keep_latest": policy.keep_latest,
        "older_than_seconds": policy.older_than,
        "max_size_bytes": policy.max_size,
        "stale_incomplete_seconds": policy.stale_incomplete,
        "in_flight_grace_seconds": policy.in_flight_grace,
    }


def _revision_document(rev: RevisionRemoval) -> dict[str, Any]:
    return {
        "commit": rev.commit,
        "refs": list(rev.refs),
        "reasons": list(rev.reasons),
        "size": rev.size,
        "freed": rev.freed,
        "last_activity": rev.last_activity,
        "expires_at": rev.expires_at,
    }


def _item_document(item: ItemRemoval) -> dict[str, Any]:
    return {"kind": item.kind, "path": item.path, "reason": item.reason, "size": item.size}


def _plan_fields(plan: PrunePlan, kind: str, dry_run: bool) -> dict[str, Any]:
    """Fields every prune document starts with: where, when, by which policy."""
    return {
        "root": str(plan.root),
        "kind": kind,
        "dry_run": dry_run,
        "at": plan.now,
        "at_iso": iso_utc(plan.now),
        "policy": policy_document(plan.policy),
    }


def _repo_fields(r: RepoPlan | RepoOutcome, remove_repo: bool) -> dict[str, Any]:
    """The part of a repo's entry that a plan and a report share."""
    return {
        "repo_id": r.repo_id,
        "repo_type": r.repo_type,
        "folder": r.folder,
        "remove_repo": remove_repo,
        "revisions": [_revision_document(x) for x in r.revisions],
        "items": [_item_document(i) for i in r.items],
        "freed": r.freed,
    }


def plan_document(plan: PrunePlan, kind: str, dry_run: bool = True) -> dict[str, Any]:
    """The ``--json`` document of a dry run (or of a prune that found nothing to do)."""
    return envelope(
        "prune",
        **_plan_fields(plan, kind, dry_run),
        repos=[{**_repo_fields(r, r.remove_repo), "kept": list(r.kept)} for r in plan.changes],
        root_items=[_item_document(i) for i in plan.root_items],
        strays=list(plan.strays),
        notes=list(plan.notes),
        revisions=plan.revision_count,
        size_before=plan.size_before,
        size_after=plan.size_after,
        freed=plan.freed,
        ok=True,
        exit_status=0,
    )


def report_document(report: PruneReport, kind: str, exit_status: int) -> dict[str, Any]:
    """The ``--json`` document of a prune that ran."""
    plan = report.plan
    return envelope(
        "prune",
        **_plan_fields(plan, kind, dry_run=False),
        repos=[
            {
                **_repo_fields(o, o.removed_repo),
                "skipped": o.skipped,
                "kept_in_use": list(o.kept_in_use),
                "errors": list(o.errors),
            }
            for o in report.repos
        ],
        root_items=[_item_document(i) for i in report.root_items],
        strays=list(plan.strays),
        notes=list(plan.notes),
        revisions=sum(len(o.revisions) for o in report.repos),
        planned_freed=plan.freed,
        freed=report.freed,
        errors=report.all_errors,
        ok=exit_status == 0,
        exit_status=exit_status,
    )


# -- text ------------------------------------------------------------------------------


#: Why a revision goes, as a person says it, for each reason a plan gives
#: (:data:`cmh.hub.prune.REVISION_REASONS`; the ``--json`` documents keep the names).
REASON_WORDS = {
    "expired": "its stamped files expired",
    "unreferenced": "no branch or tag points to it",
    "beyond-keep-latest": "older than the revisions --keep-latest keeps",
    "unused": "not used for longer than --older-than",
    "over-size": "least recently used, over --max-size",
    "broken": "a file of it lost its blob",
}

#: Why a housekeeping item goes, for each reason a plan gives
#: (:data:`cmh.hub.prune.ITEM_REASONS`).
ITEM_WORDS = {
    "orphan": "no revision links to it",
    "unlinked": "only removed revisions linked to it",
    "stale": "interrupted or spent, past its age limit",
    "dangling": "names a commit that is not there",
    "invalid": "holds no commit, or is not what its place expects",
    "not-exact": "rewritten as the bare commit",
    "revision-gone": "its revision is gone",
    "blob-gone": "its blob is gone",
    "repo-gone": "its repo is gone",
    "leftover": "left over by an interrupted write or prune",
    "empty": "an empty folder",
    "abandoned": "a fill nobody holds any more",
    "blob-stored": "a fill whose blob is stored",
    "blob-present": "a partial download whose blob is complete",
}


def counted(n: int, noun: str) -> str:
    """``1 revision``, ``0 revisions``: a count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _revision_line(rev: RevisionRemoval) -> str:
    refs = f" [{', '.join(rev.refs)}]" if rev.refs else ""
    why = ", ".join(REASON_WORDS.get(r, r) for r in rev.reasons)
    if rev.expires_at:
        why += f" (expires_at {iso_utc(rev.expires_at)})"
    return f"  revision {rev.commit[:12]}{refs}: {why}; frees {human_bytes(rev.freed)}"


def _item_lines(items: Sequence[ItemRemoval]) -> list[str]:
    counts: Counter[tuple[str, str]] = Counter()
    sizes: Counter[tuple[str, str]] = Counter()
    for i in items:
        counts[(i.kind, i.reason)] += 1
        sizes[(i.kind, i.reason)] += i.size
    lines = []
    for (kind, reason), n in sorted(counts.items()):
        size = sizes[(kind, reason)]
        words = ITEM_WORDS.get(reason, reason)
        line = f"  {kind} x{n} ({reason}: {words})"
        lines.append(line + (f", {human_bytes(size)}" if size else ""))
    return lines


def plan_lines(plan: PrunePlan, kind: str, *, dry_run: bool) -> list[str]:
    """What would go, per repo and revision, with reasons and bytes."""
    verb = "Would remove" if dry_run else "To remove"
    if plan.empty:
        return [
            f"Nothing to remove from {kind} {plan.root}: every revision is kept and nothing "
            f"is left over (judged at {iso_utc(plan.now)}).",
            *_tail(plan),
        ]
    lines = [f"{verb} from {kind} {plan.root} (judged at {iso_utc(plan.now)}):"]
    if plan.empty:
        lines.append("  nothing: every revision is kept and nothing is left over.")
    for r in plan.changes:
        whole = ": the whole repo (nothing left in it)" if r.remove_repo else ""
        lines.append(f"{r.repo_type} {r.repo_id}{whole}")
        lines += [_revision_line(x) for x in r.revisions]
        lines += _item_lines(r.items)
    if plan.root_items:
        lines.append(f"{kind} root")
        lines += _item_lines(plan.root_items)
    lines.append(
        f"Total: {counted(plan.revision_count, 'revision')}, {human_bytes(plan.freed)} freed "
        f"({human_bytes(plan.size_before)} -> {human_bytes(plan.size_after)})."
    )
    lines += _tail(plan)
    return lines


def report_lines(report: PruneReport, kind: str) -> list[str]:
    """What went, per repo and revision; what was kept because it was busy or in use."""
    lines = [f"Removed from {kind} {report.plan.root}:"]
    for o in report.repos:
        lines += _outcome_lines(o)
    if report.root_items:
        lines.append(f"{kind} root")
        lines += _item_lines(report.root_items)
    count = sum(len(o.revisions) for o in report.repos)
    lines.append(f"Total: {counted(count, 'revision')}, {human_bytes(report.freed)} freed.")
    lines += _tail(report.plan)
    return lines


def _outcome_lines(o: RepoOutcome) -> list[str]:
    whole = ": the whole repo" if o.removed_repo else ""
    lines = [f"{o.repo_type} {o.repo_id}{whole}"]
    if o.skipped:
        lines.append(f"  skipped, {o.skipped}")
    lines += [_revision_line(x) for x in o.revisions]
    lines += _item_lines(o.items)
    lines += [
        f"  kept revision {c[:12]}: in use (a reader holds its lock, or the mirror read it lately)"
        for c in o.kept_in_use
    ]
    lines += [f"  error: {e}" for e in o.errors]
    return lines


def _tail(plan: PrunePlan) -> list[str]:
    lines = [f"Note: {n}" for n in plan.notes]
    if plan.strays:
        lines.append(f"Left alone (not cache entries): {', '.join(plan.strays)}")
    return lines
