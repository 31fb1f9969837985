"""Every command's ``--help``: an example, exit statuses and text for every option.

The test walks the real click tree (the lazy group loads each command), so a
command added without an example fails here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

import click
import pytest
from cli_support import run_runner
from cmh.cli.main import COMMANDS, cli


def walk(
    group: click.Group, ctx: click.Context, prefix: str = ""
) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        path = f"{prefix}{name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from walk(command, ctx, f"{path} ")


ALL = list(walk(cli, click.Context(cli)))


def test_the_tree_has_every_command() -> None:
    paths = {p for p, _ in ALL}
    assert set(COMMANDS) <= paths
    assert {"mirror add", "mirror ls", "mirror scrub", "mirror sync"} <= paths


@pytest.mark.parametrize(("path", "command"), ALL, ids=[p for p, _ in ALL])
def test_help_has_examples_exit_statuses_and_option_text(path: str, command: click.Command) -> None:
    shown = run_runner([*path.split(), "--help"])
    assert shown.exit_code == 0, shown.stderr
    assert "Examples:" in shown.stdout and f"$ cmh {path}" in shown.stdout.replace(
        "HF_ENDPOINT=http://127.0.0.1:8080 ", ""
    )
    assert "Exit status:" in shown.stdout
    if path == "serve":  # Ctrl-C is its normal stop: exit 0, not 130
        assert "0 stopped by SIGTERM or Ctrl-C" in " ".join(shown.stdout.split())
    else:
        assert "130 interrupted" in shown.stdout
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, f"cmh {path} {param.opts[0]} has no help text"
    # Every option an example uses exists (an example that cannot run is worse than none).
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    if isinstance(command, click.Group):
        return
    for line in shown.stdout.split("Examples:")[1].split("Exit status:")[0].splitlines():
        if "$ cmh" not in line:
            continue
        words = shlex.split(line.split("$ ", 1)[1])
        for word in words:
            if word.startswith("--"):
                assert word.split("=")[0] in known, f"{line.strip()}: {word} is not an option"


def test_top_level_help_lists_mirror_subcommands_and_exit_statuses() -> None:
    shown = run_runner(["--help"]).stdout
    assert "add, ls, scrub, sync" in shown
    assert "130 interrupted" in shown and "2 usage error" in shown


@pytest.mark.parametrize(("path", "command"), ALL, ids=[p for p, _ in ALL])
def test_help_says_each_thing_once(path: str, command: click.Command) -> None:
    """One list of exit statuses (verify printed its own besides the shared one), and an
    option's help names an environment variable once (serve's --fleet-key-file twice)."""
    shown = run_runner([*path.split(), "--help"]).stdout
    assert shown.lower().count("exit status") == 1, shown
    for param in command.params:
        if isinstance(param, click.Option) and param.help:
            for name in set(re.findall(r"\b(?:CMH|HF)_[A-Z_]+\b", param.help)):
                assert param.help.count(name) == 1, f"cmh {path} {param.opts[0]}: {name} twice"


def test_mirror_help_names_every_subcommand() -> None:
    first = run_runner(["mirror", "--help"]).stdout.split("Options:")[0]
    assert "sync" in first, first
