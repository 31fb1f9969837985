"""Builders for the kinds of option several commands share (seconds, durations, files, URLs).

Each kind is spelled once here, so every command's ``--header-timeout`` or ``--tokens``
parses, defaults and shows its default the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ._common import DURATION

#: What a builder returns: a decorator that adds the option to a command.
OptionDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def seconds_option(
    name: str, default: float | None, help: str, *, positive: bool = False
) -> OptionDecorator:
    """A number of seconds, at least 0 (above 0 when ``positive``); a default is shown."""
    kind = click.FloatRange(min=0, min_open=positive)
    if default is None:
        return click.option(name, type=kind, default=None, help=help)
    return click.option(name, type=kind, default=default, show_default=True, help=help)


def duration_option(name: str, default: str | None, help: str) -> OptionDecorator:
    """A duration such as ``5m`` or ``7d``; a default is shown."""
    if default is None:
        return click.option(name, type=DURATION, help=help)
    return click.option(name, type=DURATION, default=default, show_default=True, help=help)


def file_option(name: str, help: str, *, exists: bool = True) -> OptionDecorator:
    """A file path (not a folder), none by default; ``exists``: it must exist."""
    kind = click.Path(exists=exists, dir_okay=False, path_type=Path)
    return click.option(name, type=kind, default=None, help=help)


def url_option(name: str, help: str) -> OptionDecorator:
    """A URL, none by default."""
    return click.option(name, default=None, metavar="URL", help=help)


def flag_option(name: str, help: str) -> OptionDecorator:
    """An on/off flag, off by default."""
    return click.option(name, is_flag=True, help=help)


def repo_type_option(
    help: str, *, kinds: tuple[str, ...] = ("model", "dataset")
) -> OptionDecorator:
    """``--repo-type``: one of ``kinds``, ``model`` by default (shown)."""
    kind = click.Choice(list(kinds))
    return click.option("--repo-type", type=kind, default="model", show_default=True, help=help)


def count_option(name: str, low: int, high: int, default: int | None, help: str) -> OptionDecorator:
    """A whole number from ``low`` to ``high``; a default is shown."""
    kind = click.IntRange(low, high)
    if default is None:
        return click.option(name, type=kind, default=None, help=help)
    return click.option(name, type=kind, default=default, show_default=True, help=help)
