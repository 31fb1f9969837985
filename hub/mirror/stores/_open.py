"""The one place that builds a store from what ``--store`` names."""

from __future__ import annotations

from pathlib import Path

from ._base import MirrorStore


def open_store(location: Path | str, *, ref_ttl: float | None = None) -> MirrorStore:
    """The store at ``location``: an ``s3://bucket/prefix`` URL or a folder.

    ``ref_ttl``: how long a server's bucket reader trusts a ref it read (None: the
    default). Opening does not touch the storage; a bucket's settings are checked.
    """
    text = str(location)
    if isinstance(location, str) and text.startswith("s3://"):
        from .bucket import BucketBackedStore

        return BucketBackedStore.open(text, ref_ttl=ref_ttl)
    from .local import LocalStore

    return LocalStore(Path(location))
