"""``--store``: a local store folder, or a bucket store ``s3://bucket/prefix``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._common import EXIT_USAGE, fail

if TYPE_CHECKING:
    from cmh.hub.mirror.bucket import BucketStore

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
        text = str(value)
        if text.startswith("s3://"):
            from cmh.hub.mirror.objectstore import InvalidLocation, S3Location

            try:
                S3Location.parse(text)
            except InvalidLocation as exc:
                self.fail(str(exc), param, ctx)
            return text
        if "://" in text:
            self.fail(f"{text!r}: only s3:// URLs or folders are stores", param, ctx)
        path = Path(text)
        if path.exists() and not path.is_dir():
            self.fail(
                f"{text}: is a file, not a store folder (give a folder path, e.g. ./store; "
                "`cmh mirror add` creates it)",
                param,
                ctx,
            )
        return path


STORE = StoreType()


def open_bucket_or_fail(url: str) -> BucketStore:
    """Open a bucket store with the standard AWS settings; a clear error otherwise."""
    from cmh.hub.mirror.bucket import BucketError, open_bucket

    try:
        return open_bucket(url)
    except BucketError as exc:
        fail(str(exc), EXIT_USAGE)
