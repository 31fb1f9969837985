"""What the Hub derives from a commit's files: model card fields and safetensors parameter counts.

Both are pure functions of blob bytes, so each is computed once per blob
(ETag) and kept for the :data:`MAX_ENTRIES` blobs asked most recently.

- The **card**: the YAML front matter of the root ``README.md`` (read from the
  first :data:`MAX_CARD_BYTES` bytes by :mod:`cmh.hub.mirror._front_matter`) gives
  ``cardData``, ``pipeline_tag``, ``library_name`` and the ``tags`` the
  Hub computes from it. The whole card is hashed against its ETag first.
- **safetensors**: parameters per dtype summed over the weight files'
  headers (read by :func:`cmh.read_header_from`, never the tensors;
  the weights are not hashed for this: ``cmh mirror scrub`` checks them).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, BinaryIO

from cmh.hub.cache import json_value, new_digest

from cmh import CMHError, read_header_from

from ._front_matter import read_front_matter
from ._index import CommitIndex, FileEntry
from ._memo import Memo

CARD_FILE = "README.md"
MAX_CARD_BYTES = 1 << 20
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
MAX_INDEX_BYTES = 16 << 20
MAX_ENTRIES = 1024
_CHUNK = 1 << 20

#: Card keys whose values become ``key:value`` tags: for models (the Hub's
#: ``license:``, ``dataset:``, ``base_model:`` tags) and datasets.
_MODEL_PREFIXED = (("datasets", "dataset"), ("base_model", "base_model"), ("license", "license"))
_DATASET_PREFIXED = (
    "task_categories", "task_ids", "language", "multilinguality", "size_categories",
    "language_creators", "annotations_creators", "source_datasets", "license",
)  # fmt: skip

Opener = Callable[[FileEntry], BinaryIO]


@dataclass(frozen=True)
class CardFields:
    """The repo-info fields the Hub derives from a card's front matter."""

    card_data: dict[str, Any] | None = None
    pipeline_tag: str | None = None
    library_name: str | None = None
    tags: list[str] = field(default_factory=list)


NO_CARD = CardFields()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def card_fields(data: dict[str, Any] | None, repo_type: str) -> CardFields:
    """The Hub's fields from front matter: ``pipeline_tag`` and ``library_name`` as given, and
    ``tags`` (for a model: library, card tags, pipeline tag, languages, then ``dataset:``,
    ``base_model:`` and ``license:`` tags; for a dataset: card tags, then ``{key}:{value}``
    for each key of :data:`_DATASET_PREFIXED`), each once, in that order."""
    if data is None:
        return NO_CARD
    pipeline = data.get("pipeline_tag") if isinstance(data.get("pipeline_tag"), str) else None
    library = data.get("library_name") if isinstance(data.get("library_name"), str) else None
    tags: list[str] = []
    if repo_type == "model":
        tags += _strings(library) + _strings(data.get("tags")) + _strings(pipeline)
        tags += _strings(data.get("language"))
        for key, prefix in _MODEL_PREFIXED:
            tags += [f"{prefix}:{v}" for v in _strings(data.get(key))]
    else:
        tags += _strings(data.get("tags"))
        for key in _DATASET_PREFIXED:
            tags += [f"{key}:{v}" for v in _strings(data.get(key))]
    return CardFields(data, pipeline, library, list(dict.fromkeys(tags)))


def safetensors_files(index: CommitIndex) -> list[FileEntry]:
    """``model.safetensors`` if the commit has it, else every ``*.safetensors`` file at the root."""
    single = index.files.get(SAFETENSORS_SINGLE)
    if single is not None:
        return [single]
    return [e for p, e in index.files.items() if "/" not in p and p.endswith(".safetensors")]


class Unreadable(OSError):
    """A blob that cannot be read now (quarantined, gone): nothing about it is cached."""


class DerivedCache:
    """Card fields and parameter counts of a worker, by blob, least recently used dropped first."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: Memo[Hashable, Any] = Memo(max_entries)

    def _get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The value kept for ``key``, else ``compute()`` (outside the lock: a slow blob never
        holds up another repo); :class:`Unreadable` is never kept."""
        return self._entries.get_or_compute(key, compute)

    def card(self, index: CommitIndex, repo_type: str, opener: Opener) -> CardFields:
        """The fields of the commit's ``README.md`` (:data:`NO_CARD` without a readable one)."""
        entry = index.files.get(CARD_FILE)
        if entry is None:
            return NO_CARD

        def compute() -> CardFields:
            raw = _read_checked(entry, opener, MAX_CARD_BYTES)
            text = raw.decode("utf-8-sig", errors="replace")
            return card_fields(read_front_matter(text).data, repo_type)

        try:
            result: CardFields = self._get(("card", repo_type, entry.etag), compute)
        except Unreadable:
            return NO_CARD
        return result

    def safetensors(self, index: CommitIndex, opener: Opener) -> dict[str, Any] | None:
        """``{"parameters": {dtype: count}, "total": n}`` over the weight files (the shards of
        ``model.safetensors.index.json`` when it exists, else :func:`safetensors_files`), or
        ``None`` without any or when one cannot be read (a partial count would be wrong)."""
        try:
            files = self._weight_files(index, opener)
            counts = [self._get(("params", e.etag), partial(_count, e, opener)) for e in files]
        except Unreadable:
            return None
        if not files or any(c is None for c in counts):
            return None
        parameters: dict[str, int] = {}
        for count in counts:
            for dtype, n in count.items():
                parameters[dtype] = parameters.get(dtype, 0) + n
        return {"parameters": dict(sorted(parameters.items())), "total": sum(parameters.values())}

    def _weight_files(self, index: CommitIndex, opener: Opener) -> list[FileEntry]:
        entry = index.files.get(SAFETENSORS_INDEX)
        if entry is None:
            return safetensors_files(index)
        names = self._get(("shards", entry.etag), lambda: _shard_names(entry, opener))
        shards = [index.files.get(n) for n in names or []]
        if not shards or any(s is None for s in shards):
            return []  # an index naming no file, or a file this commit does not have
        return [s for s in shards if s is not None]


def _read(entry: FileEntry, opener: Opener, limit: int) -> bytes:
    try:
        with opener(entry) as f:
            return f.read(limit)
    except OSError as exc:
        raise Unreadable(str(exc)) from None


def _read_checked(entry: FileEntry, opener: Opener, limit: int) -> bytes:
    """The first ``limit`` bytes of a blob whose whole content hashes to its ETag."""
    digest = new_digest(entry.etag, entry.size)
    head = bytearray()
    try:
        with opener(entry) as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                head += chunk[: max(0, limit - len(head))]
    except OSError as exc:
        raise Unreadable(str(exc)) from None
    if digest.hexdigest() != entry.etag:
        raise Unreadable("blob does not match its name")
    return bytes(head)


def _count(entry: FileEntry, opener: Opener) -> dict[str, int] | None:
    """Parameters per dtype in one file's header; ``None`` if the header is not valid."""
    try:
        with opener(entry) as f:
            header = read_header_from(f, entry.size, path=entry.path)
    except CMHError:
        return None
    except OSError as exc:
        raise Unreadable(str(exc)) from None
    counts: dict[str, int] = {}
    for tensor in header.tensors:
        counts[tensor.dtype] = counts.get(tensor.dtype, 0) + tensor.elements
    return counts


def _shard_names(entry: FileEntry, opener: Opener) -> list[str] | None:
    """The distinct files a ``model.safetensors.index.json`` weight map names, or ``None``."""
    if entry.size > MAX_INDEX_BYTES:
        return None
    try:
        data = json_value(_read(entry, opener, MAX_INDEX_BYTES))
    except ValueError:
        return None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        return None
    names = [v for v in weight_map.values() if isinstance(v, str)]
    return sorted(set(names)) if len(names) == len(weight_map) else None
