"""``--store``: a local store folder, or a bucket store ``s3://bucket/prefix``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._common import EXIT_UNREADABLE, EXIT_USAGE, fail

if TYPE_CHECKING:
    from cmh.hub.mirror import MirrorStore, StoreError

#: What ``--store`` gives a command: a folder, or the URL of a bucket store.
StoreLocation = Path | str

if TYPE_CHECKING:
    _StoreParam = click.ParamType[StoreLocation]
else:  # click < 8.2 has no generic ParamType at runtime
    _StoreParam = click.ParamType


class StoreType(_StoreParam):
    """A folder path, or an ``s3://bucket/prefix`` URL (checked, not opened)."""

    name = "STORE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Path):
            return value
        if not str(value).strip():  # "" would silently be the current folder
            self.fail("an empty path names no store: give a folder (e.g. ./store) or "
                      "s3://BUCKET/PREFIX", param, ctx)  # fmt: skip
        from cmh.hub.mirror import InvalidLocation, parse_location

        try:
            return parse_location(str(value))
        except InvalidLocation as exc:
            self.fail(str(exc), param, ctx)


STORE = StoreType()


def open_store_or_fail(location: StoreLocation, *, existing: bool = True) -> MirrorStore:
    """The store ``--store`` names; a clear error (exit 2) when it cannot be opened, or,
    with ``existing``, when it does not exist (exit 2) or its storage fails (exit 3)."""
    from cmh.hub.cache import process_clock
    from cmh.hub.mirror import StoreError, StoreMissing, open_store

    try:
        store = open_store(location, clock=process_clock())  # the command's one clock
        if existing:
            store.check()
    except StoreError as exc:
        fail(str(exc), store_exit_status(exc, usage=(StoreMissing,), otherwise=EXIT_USAGE))
    return store


def store_exit_status(
    exc: StoreError, *, usage: tuple[type[StoreError], ...], otherwise: int
) -> int:
    """The exit status for a store error: 2 for the kinds in ``usage`` (the command asked
    for something the store cannot do), 3 when the storage is unavailable, else ``otherwise``."""
    from cmh.hub.mirror import StoreUnavailable

    if isinstance(exc, usage):
        return EXIT_USAGE
    if isinstance(exc, StoreUnavailable):
        return EXIT_UNREADABLE
    return otherwise
