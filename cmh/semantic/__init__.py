"""Semantic fingerprints: content-derived keys for the caches of inference runtimes.

KV/prefix caches need the exact weights and tokenizer, tokenization caches only
the tokenizer, compiled-graph caches only the architecture and shapes.
:func:`fingerprint` reads a model or adapter directory (headers and small JSON
files only, when every weight file is stamped) and returns a
:class:`ModelFingerprint` whose :meth:`~ModelFingerprint.cache_key` and
:meth:`~ModelFingerprint.compatible` give runtimes keys that change when the
content behind a model name changes. Normative text: ``spec/semantic.md``.

>>> fp = fingerprint("path/to/model")                  # doctest: +SKIP
>>> fp.cache_key("kv")                                 # doctest: +SKIP
'3f2a9c0d51e87b64/kv/9b1e...'
"""

from __future__ import annotations

from .canonical import (
    ADAPTER_CONFIG_DROPPED,
    CONFIG_DROPPED,
    TOKENIZER_DROPPED,
    TOKENIZER_FILES,
    canonical_json,
)
from .errors import CacheKindError, FingerprintFormatError, NotAModelError, SemanticError
from .model import CACHE_KINDS, FORMAT, ModelFingerprint
from .reader import fingerprint, fingerprint_files
from .task import task_from_class
from .tensors import graph_hash

__all__ = [
    "ADAPTER_CONFIG_DROPPED",
    "CACHE_KINDS",
    "CONFIG_DROPPED",
    "FORMAT",
    "TOKENIZER_DROPPED",
    "TOKENIZER_FILES",
    "CacheKindError",
    "FingerprintFormatError",
    "ModelFingerprint",
    "NotAModelError",
    "SemanticError",
    "canonical_json",
    "fingerprint",
    "fingerprint_files",
    "graph_hash",
    "task_from_class",
]
