"""Entry point and lazily loaded command group of the ``cmh`` command line."""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Any

import click

from cmh import __version__

# name -> (module below cmh.cli holding the command of that name, one-line help for `cmh --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "stamp": ("_format_commands", "Stamp safetensors files with a CMH record."),
    "verify": ("_format_commands", "Verify stamped files; exit 1 on any failure."),
    "inspect": ("_format_commands", "Show a file's record, manifests and tensors."),
    "fingerprint": ("_format_commands", "Print a file's root or a directory's identity."),
    "keygen": ("_format_commands", "Write a new Ed25519 key pair."),
    "sign": ("_format_commands", "Sign an already stamped file in place."),
    "mirror": ("_mirror_commands", "Manage a mirror store (add, ls, scrub, sync)."),
    "serve": ("_mirror_commands", "Serve a store through the Hub HTTP API."),
    "pull": ("_pull_command", "Resolve a repo into the local Hugging Face cache."),
    "prune": ("_prune_command", "Prune stale revisions from a cache or store."),
    "completion": ("_completion", "Print or install shell completion (bash, zsh, fish)."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name = f"cmh.cli.{entry[0]}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return None
        command = getattr(module, cmd_name)
        assert isinstance(command, click.Command)
        from ._examples import add_epilogs

        return add_epilogs(command, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click's, with "Did you mean" among every command (none is loaded yet)."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            name = args[0] if args else ""
            close = difflib.get_close_matches(name, list(COMMANDS), n=3)
            if name in COMMANDS or not close or "Did you mean" in exc.message:
                raise
            hint = " or ".join(repr(c) for c in close)
            raise click.UsageError(f"No such command {name!r}. Did you mean {hint}?", ctx) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cmh")
def cli() -> None:
    """cmh: trustworthy, cheap-to-refresh model weights.

    Stamp and verify safetensors files, serve a Hub mirror, resolve and prune caches.
    `cmh COMMAND --help` shows each command's options, examples and exit statuses.

    \b
    Exit statuses: 0 ok, 1 a check failed or was refused, 2 usage error,
    3 unreadable input or unobtainable repo, 130 interrupted (Ctrl-C),
    141 stdout's reader went away (cmh ... | head), quietly.
    """


def _pass_undecodable_names() -> None:
    """Write a file name's non-UTF-8 bytes back as they came (as ``ls`` does), never a traceback.

    Python hands such bytes over as lone surrogates; a strict stdout (a UTF-8
    locale other than C) would raise on them. ``--json`` documents replace them
    before printing (``emit_json``), so JSON stays valid UTF-8 either way.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "") == "strict":
            reconfigure(errors="surrogateescape")


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point."""
    from ._common import WHOLE_PROCESS

    WHOLE_PROCESS.set()  # budgets from the process's start (cmh pull's blackholed Hub)
    _pass_undecodable_names()
    try:
        return cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="cmh")
    except SystemExit:
        _end_on_closed_stdout()
        raise


def _end_on_closed_stdout() -> None:
    """Exit 141, quietly, when a write to stdout failed because its reader had gone:
    outside a command (click then exits 1 after quieting its streams), or at the last
    flush of what is still buffered. A command's own write is handled where it fails
    (``_common.handle_errors``)."""
    from click.utils import _PacifyFlushWrapper

    from ._common import quit_closed_stdout

    if isinstance(sys.stdout, _PacifyFlushWrapper):  # click met EPIPE
        quit_closed_stdout()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        quit_closed_stdout()


if __name__ == "__main__":
    main()
