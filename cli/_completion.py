"""``cmh completion``: shell completion of commands, options and paths (click's own)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ._common import EXIT_OK, fail, handle_errors

#: shell -> (file the line goes in, the line that loads the completion)
SHELLS = {
    "bash": ("~/.bashrc", 'eval "$(_CMH_COMPLETE=bash_source cmh)"'),
    "zsh": ("~/.zshrc", 'eval "$(_CMH_COMPLETE=zsh_source cmh)"'),
    "fish": ("~/.config/fish/completions/cmh.fish", "_CMH_COMPLETE=fish_source cmh | source"),
}


def _script(shell: str) -> str:
    from click.shell_completion import get_completion_class

    from .main import cli

    kind = get_completion_class(shell)
    assert kind is not None
    return kind(cli, {}, "cmh", "_CMH_COMPLETE").source()


@click.command()
@click.argument("shell", type=click.Choice(sorted(SHELLS)), required=False)
@click.option(
    "--install",
    is_flag=True,
    help="Add the line that loads it to the shell's start-up file (once); else print the script.",
)
@handle_errors
def completion(shell: str | None, install: bool) -> None:
    """Print the completion script of SHELL (default: $SHELL's), or --install it.

    Completes commands, options, choices and paths: `cmh st<TAB>` gives `stamp`.
    """
    shell = shell or os.path.basename(os.environ.get("SHELL", "")) or "bash"
    if shell not in SHELLS:
        fail(f"no completion for the shell {shell!r}: name one of {', '.join(SHELLS)}", 2)
    if not install:
        click.echo(_script(shell))
        return
    where, line = SHELLS[shell]
    path = Path(os.path.expanduser(where))
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if line in text:
        click.echo(f"already installed in {path}")
        raise click.exceptions.Exit(EXIT_OK)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        start = "" if not text or text.endswith("\n") else "\n"
        f.write(f"{start}{line}  # cmh completion\n")
    click.echo(f"added to {path}: {line}\nopen a new shell, or run that line, to use it")
