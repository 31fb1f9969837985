"""The one place that builds a store from what ``--store`` names."""

from __future__ import annotations

from pathlib import Path

from cmh.hub.cache import Clock

from ._base import MirrorStore


def parse_location(text: str) -> Path | str:
    """What ``--store`` names, checked but not opened: an ``s3://`` URL (kept as text) or
    a folder path (:class:`~cmh.hub.mirror.InvalidLocation` otherwise)."""
    from .bucket._objectstore import InvalidLocation, S3Location

    if text.startswith("s3://"):
        S3Location.parse(text)
        return text
    if "://" in text:
        raise InvalidLocation(f"{text!r}: only s3:// URLs or folders are stores")
    path = Path(text)
    try:
        is_file = path.exists() and not path.is_dir()
    except OSError as exc:  # a name longer than 255 bytes, a path longer than 4096, ...
        raise InvalidLocation(
            f"{text}: cannot be a store folder: {exc.strerror or exc} (a name in a path "
            "holds at most 255 bytes, the whole path 4096)"
        ) from None
    if is_file:
        raise InvalidLocation(
            f"{text}: is a file, not a store folder (give a folder path, e.g. ./store; "
            "`cmh mirror add` creates it)"
        )
    return path


def open_store(
    location: Path | str,
    *,
    ref_ttl: float | None = None,
    public_storage_url: str | None = None,
    clock: Clock | None = None,
) -> MirrorStore:
    """The store at ``location``: an ``s3://bucket/prefix`` URL, a folder, or
    ``memory://NAME`` (a store in this process's memory, for tests).

    ``ref_ttl``: how long a server's bucket reader trusts a ref it read (None: the
    default); ``public_storage_url``: the storage endpoint redirects are signed for;
    ``clock``: the process's (:func:`~cmh.hub.cache.process_clock` when None).
    Opening does not touch the storage; a bucket's settings are checked.
    """
    text = str(location)
    if isinstance(location, str) and text.startswith("s3://"):
        from .bucket._store import BucketBackedStore

        return BucketBackedStore.open(
            text, ref_ttl=ref_ttl, public_storage_url=public_storage_url, clock=clock
        )
    from .._errors import StoreError

    if public_storage_url is not None:
        raise StoreError("--public-storage-url applies to bucket stores (redirect delivery)")
    if isinstance(location, str) and text.startswith("memory://"):
        from .memory._store import open_memory

        return open_memory(text, clock)
    from .local._store import LocalStore

    return LocalStore(Path(location), clock)
