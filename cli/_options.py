"""Builders for the kinds of option several commands share (seconds, durations, files, URLs).

Each kind is spelled once here, so every command's ``--header-timeout`` or ``--tokens``
parses, defaults and shows its default the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ._common import DURATION

#: What a builder returns: a decorator that adds the option to a command.
OptionDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]


#: The most seconds any seconds option takes (about 31 years): more overflows a sleep or a
#: timeout (``time.sleep(1e10)`` raises ``OverflowError``) and is no amount of waiting.
MAX_SECONDS = 1e9


class FiniteFloatRange(click.FloatRange):
    """click's ``FloatRange``, which also refuses ``nan`` and ``inf`` (no amount of anything)
    and more than :data:`MAX_SECONDS`."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if number > MAX_SECONDS:
            self.fail(f"{value!r} is more than {MAX_SECONDS:.0f} seconds (about 31 years)",
                      param, ctx)  # fmt: skip
        return number


class FolderPath(click.Path):
    """A folder path that is not empty (``""`` would silently be the current folder)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path names no folder: give the folder (e.g. ./cache)", param, ctx)
        return super().convert(value, param, ctx)


def seconds_option(
    name: str, default: float | None, help: str, *, positive: bool = False
) -> OptionDecorator:
    """A finite number of seconds, at least 0 (above 0 when ``positive``); a default is shown."""
    kind = FiniteFloatRange(min=0, min_open=positive)
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


def trust_origin_option() -> OptionDecorator:
    """``--trust-origin URL`` (repeatable): an origin on a local address (a local CDN, the
    storage a mirror presigns for) a Hub's redirect may lead to. Added to
    ``CMH_TRUSTED_ORIGINS`` for this process and what it starts (the resolver reads it)."""

    def trust(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> None:
        import os
        from urllib.parse import urlsplit

        from cmh.hub.resolver import TRUSTED_ORIGINS_ENV

        for value in values:
            try:
                parts = urlsplit(value)
            except ValueError as exc:  # an unclosed IPv6 bracket: 'http://[::1'
                raise click.BadParameter(f"{value!r} is not an origin: {exc}", ctx, param) from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise click.BadParameter(
                    f"{value!r} is not an origin: give scheme, host and port "
                    "(e.g. http://127.0.0.2:9000)",
                    ctx,
                    param,
                )
        if values:
            known = os.environ.get(TRUSTED_ORIGINS_ENV, "").split()
            os.environ[TRUSTED_ORIGINS_ENV] = " ".join([*known, *values])

    return click.option(
        "--trust-origin",
        multiple=True,
        metavar="URL",
        expose_value=False,
        callback=trust,
        help="An origin on a local address (a local CDN, presigned storage) a Hub's "
        "redirect may lead to; repeatable (also CMH_TRUSTED_ORIGINS).",
    )
