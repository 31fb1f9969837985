"""``cmh pull``: resolve a repo into the local Hugging Face cache.

Exit statuses: 0 resolved (including a stale snapshot served with a warning),
1 refused by a check or the policy (content failed its ETag or manifest
check, ``--strict`` and expired), 2 usage error (bad repo id or revision),
3 the repo could not be obtained (not found, access refused, Hub unreachable
with nothing cached, a new commit the Hub named whose files could not be
fetched, offline with nothing cached, a served safetensors file
with an invalid header, no space left in the cache). With ``--json`` a
failure (1 or 3) prints one document too: ``ok`` false, ``error_kind``, ``error``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from cmh import plural

from ._common import (
    EXIT_CHECK_FAILED,
    EXIT_UNREADABLE,
    WHOLE_PROCESS,
    check_hub_url,
    describe_os_error,
    echo,
    emit_json,
    envelope,
    fail,
    human_bytes,
    json_option,
    late_progress_bar,
    report_waits,
    usage_error,
    warn,
)
from ._interrupt import stop_on_interrupt
from ._options import count_option, repo_type_option, trust_origin_option


@dataclass(frozen=True)
class _PullOptions:
    """The options of ``cmh pull`` as click passes them."""

    revision: str
    repo_type: str
    cache_dir: str | None
    endpoint: str | None
    patterns: tuple[str, ...]
    offline: bool
    strict: bool
    revalidate: bool
    connections: int | None
    as_json: bool


@click.command("pull")
@click.argument("repo_id")
@click.option("--revision", default="main", show_default=True, help="Branch, tag or commit.")
@repo_type_option(
    "What kind of repo REPO_ID names (as the Hub's /models, /datasets, /spaces).",
    kinds=("model", "dataset", "space"),
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Cache folder (default: HF_HUB_CACHE, else HF_HOME/hub).",
)
@click.option("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT).")
@click.option("--include", "patterns", multiple=True, help="Only files matching this pattern.")
@click.option("--offline", is_flag=True, help="Never touch the network (also HF_HUB_OFFLINE=1).")
@click.option("--strict", is_flag=True, help="Refuse expired or unverified content.")
@click.option("--revalidate", is_flag=True, help="Ask the Hub even if the snapshot is fresh.")
@count_option(
    "--connections",
    1,
    64,
    None,
    "Parallel range connections per large file (default: CMH_DOWNLOAD_CONNECTIONS, else 8).",
)
@trust_origin_option()
@json_option
def pull(repo_id: str, **options: Any) -> None:
    """Resolve REPO_ID into the local cache and print the snapshot folder."""
    opt = _PullOptions(**options)
    from cmh.hub.cache import LayoutError
    from cmh.hub.resolver import (
        IntegrityError,
        Policy,
        PolicyError,
        ResolveError,
        process_age,
        resolve,
    )

    def refuse(exc: Exception, exit_code: int) -> NoReturn:
        message = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
        if error_kind(exc) == "not_found":
            message += (
                "; check the spelling (repo ids are case-sensitive, e.g. "
                "sentence-transformers/all-MiniLM-L6-v2), the --repo-type and --revision; "
                "a private or gated repo also answers not found without a token (set HF_TOKEN)"
            )
        if opt.as_json:
            emit_json(
                envelope(
                    "pull",
                    repo_id=repo_id,
                    revision=opt.revision,
                    ok=False,
                    exit_status=exit_code,
                    error_kind=error_kind(exc),
                    error=message,
                )
            )
        fail(message, exit_code)

    if opt.endpoint is not None:
        check_hub_url(opt.endpoint, "--endpoint")
    elif not opt.offline:
        check_hub_url(os.environ.get("HF_ENDPOINT") or None, "HF_ENDPOINT")
    overrides: dict[str, Any] = {"strict": opt.strict, "revalidate": opt.revalidate}
    if opt.offline:
        overrides["offline"] = True
    if opt.connections is not None:
        overrides["connections"] = opt.connections
    try:
        policy = Policy.from_env(**overrides)
    except ValueError as exc:  # CMH_DOWNLOAD_CONNECTIONS out of range
        usage_error(str(exc))
    if WHOLE_PROCESS.is_set():  # a Hub that never answers costs HF_HUB_ETAG_TIMEOUT from
        # the process's start (interpreter and imports included), not its first request
        policy = dataclasses.replace(policy, started=policy.clock.monotonic() - process_age())
    resume = "finished files and chunks are kept; run the same command again to resume"
    desc = f"pull {repo_id} ({policy.connections} conn)"
    with (
        stop_on_interrupt(resume),
        report_waits(),
        late_progress_bar(desc, show=not opt.as_json) as bar,
    ):
        try:
            res = resolve(
                repo_id,
                opt.revision,
                repo_type=opt.repo_type,
                cache_dir=opt.cache_dir,
                endpoint=opt.endpoint,
                allow_patterns=list(opt.patterns) or None,
                policy=policy,
                progress=bar.advance,
                on_total=bar.on_total,
            )
        except LayoutError as exc:
            usage_error(str(exc))
        except (IntegrityError, PolicyError) as exc:
            refuse(exc, EXIT_CHECK_FAILED)
        except (ResolveError, OSError) as exc:
            refuse(exc, EXIT_UNREADABLE)
    if opt.as_json:
        document = envelope("pull", ok=True, exit_status=0, error_kind=None, error=None)
        emit_json({**document, **res.to_json()})
        return
    for w in res.warnings:
        warn(w)
    echo(str(res.path))
    click.echo(outcome_words(res), err=True)


def outcome_words(res: Any) -> str:
    """What a resolve did, in a person's words (``--json`` keeps the state names)."""
    commit = res.commit[:12]
    previous = (res.previous_commit or "")[:12]
    requests = plural(res.requests, "request")
    words = {
        "missing": f"downloaded commit {commit} (it was not in the cache)",
        "local_only": f"up to date: commit {commit}, stamped and not expired, so the Hub "
        "was not asked",
        "fresh": f"up to date: commit {commit}, the Hub confirmed it",
        "etag_mismatch": f"updated to commit {commit}"
        + (f" (was {previous})" if previous and previous != commit else ""),
        "stale_offline": f"using the cached commit {commit}: the Hub could not be asked",
        "corrupt": f"repaired commit {commit}: a cached file failed its check and was fetched "
        "again",
    }
    resumed = [f for f in res.files if getattr(f.action, "value", f.action) == "resumed"]
    if res.state.value == "missing" and resumed:  # an interrupted pull, resumed
        words["missing"] = (
            f"downloaded commit {commit}, resuming {plural(len(resumed), 'file')} an earlier "
            "run had begun"
        )
    done = words.get(res.state.value, f"{res.state.value}: commit {commit}")
    return (
        f"{done}; {requests}, {human_bytes(res.bytes_transferred)} downloaded, "
        f"{human_bytes(res.bytes_reused)} reused from the cache"
    )


#: ``error_kind`` of a failed ``cmh pull --json``, by error class name (most specific first).
ERROR_KINDS = (
    ("InvalidRemoteFileError", "invalid_file"),
    ("DiskFullError", "disk_full"),
    ("IntegrityError", "integrity"),
    ("PolicyError", "policy"),
    ("NotFoundError", "not_found"),
    ("AccessError", "access"),
    ("OfflineError", "offline"),
    ("HubUnreachableError", "unreachable"),
    ("HubProtocolError", "protocol"),
    ("ResolveError", "resolve"),
    ("OSError", "os_error"),
)


def error_kind(exc: BaseException) -> str:
    """The stable ``error_kind`` name of a failure (docs/resolver.md)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return next((kind for name, kind in ERROR_KINDS if name in names), "error")
