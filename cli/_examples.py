"""Examples and exit statuses at the end of every command's ``--help``.

Kept in one table so every command gets them the same way (the group adds them
when it loads a command); ``tests/test_cli_help.py`` walks the click tree and
fails on a command without an example.
"""

from __future__ import annotations

import click

#: Exit statuses shared by the format commands (cli/_common.py).
FORMAT_EXITS = "0 ok, 1 a check failed, 2 usage error, 3 unreadable or not a safetensors file"
#: Ctrl-C, for every command.
INTERRUPTED = "130 interrupted (Ctrl-C)"

#: command path (as typed after ``cmh``) -> (example lines, exit statuses)
EXAMPLES: dict[str, tuple[tuple[str, ...], str]] = {
    "stamp": (
        ("cmh stamp model.safetensors --ttl 30d", "cmh stamp ./checkpoint --sign-key release.key"),
        FORMAT_EXITS,
    ),
    "verify": (
        ("cmh verify model.safetensors", "cmh verify ./checkpoint --key release.pub --json"),
        "0 every file ok, 1 a check failed (mismatch, expired, bad or untrusted signature, "
        "unstamped, index and shards disagree), 2 usage error, 3 unreadable or not a "
        "safetensors file",
    ),
    "inspect": (  # it shows what a file says (an expired stamp, a bad signature): no check fails
        ("cmh inspect model.safetensors", "cmh inspect model.safetensors --json"),
        "0 shown, 2 usage error, 3 unreadable or not a safetensors file",
    ),
    "fingerprint": (
        ("cmh fingerprint model.safetensors", "cmh fingerprint ./checkpoint"),
        FORMAT_EXITS,
    ),
    "keygen": (
        ("cmh keygen --out release", "cmh keygen --out release --encrypt"),
        "0 written, 2 usage error (files exist: --force), 3 the files could not be written",
    ),
    "sign": (("cmh sign model.safetensors --key release.key",), FORMAT_EXITS),
    "mirror": (
        (
            "cmh mirror add ./my-model --store ./store --repo acme/my-model",
            "cmh mirror ls --store ./store",
        ),
        "as the subcommand's",
    ),
    "mirror add": (
        (
            "cmh mirror add ./my-model --store ./store --repo acme/my-model",
            "cmh mirror add ./my-model --store s3://bucket/mirror --repo acme/my-model "
            "--revision v1",
        ),
        "0 imported, 1 refused by the store, 2 usage error, 3 unreadable input",
    ),
    "mirror ls": (
        ("cmh mirror ls --store ./store", "cmh mirror ls --store ./store --json"),
        "0 listed, 2 usage error (no such store)",
    ),
    "mirror scrub": (
        ("cmh mirror scrub --store ./store", "cmh mirror scrub --store ./store --no-quarantine"),
        "0 every blob good, 1 a bad blob, 2 usage error (no such store), "
        "3 an unreadable or invalid blob, or the storage unreachable",
    ),
    "mirror sync": (
        (
            "cmh mirror sync acme/my-model --store ./store --from https://huggingface.co",
            "cmh mirror sync acme/my-model --store s3://bucket/hub --from https://huggingface.co "
            "--cache-dir /data/sync-cache",
        ),
        "0 synced, 1 refused by a check, 2 usage error, 3 could not be obtained",
    ),
    "serve": (
        (
            "cmh serve --store ./store --port 8080",
            "cmh serve --store ./cache --upstream https://huggingface.co --workers 4",
        ),
        "0 stopped by SIGTERM or Ctrl-C (SIGINT) after the requests in flight, "
        "1 a worker died, 2 usage error (bad store or --host, port in use), 3 the storage "
        "unreachable",
    ),
    "pull": (
        (
            "HF_ENDPOINT=http://127.0.0.1:8080 cmh pull acme/my-model",
            "cmh pull acme/my-model --revision v1 --include '*.json' --json",
        ),
        "0 resolved, 1 refused by a check or --strict, 2 usage error, 3 could not be obtained",
    ),
    "completion": (
        ("cmh completion bash --install", 'eval "$(cmh completion zsh)"'),
        "0 printed or installed, 2 usage error (unknown shell)",
    ),
    "prune": (
        (
            "cmh prune --cache-dir ~/.cache/huggingface/hub --keep-latest 1",
            "cmh prune --store ./store --expired --grace 7d --yes",
        ),
        "0 done or nothing to do (busy repos and revisions in use are skipped), 1 declined "
        "or a deletion failed, 2 usage error (also: refusing to delete without --yes when "
        "stdin is not a terminal, a folder that is no cache), 3 the cache or store cannot "
        "be read",
    ),
}


def epilog(path: str) -> str | None:
    """The ``Examples`` and ``Exit status`` text of ``cmh <path> --help``."""
    entry = EXAMPLES.get(path)
    if entry is None:
        return None
    lines, exits = entry
    example = "\n".join(f"  $ {line}" for line in lines)
    ends = "" if "Ctrl-C" in exits else f"; {INTERRUPTED}"  # serve: Ctrl-C is a normal stop
    return f"\b\nExamples:\n{example}\n\n\b\nExit status: {exits}{ends}."


def add_epilogs(command: click.Command, path: str) -> click.Command:
    """Give ``command`` (and its subcommands) their epilog, unless they have one."""
    if command.epilog is None:
        command.epilog = epilog(path)
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            add_epilogs(sub, f"{path} {name}")
    return command
