"""Semantic fingerprints: content-derived keys for the caches of inference runtimes.

KV/prefix caches need the exact weights and config (and processor, code),
tokenization caches only the tokenizer, compiled-graph caches the architecture,
shapes and config. :func:`fingerprint` reads a model or adapter directory
(headers and small files only, when every weight file carries a stamp that may
be trusted) and returns a
:class:`ModelFingerprint` whose :meth:`~ModelFingerprint.cache_key` and
:meth:`~ModelFingerprint.compatible` give runtimes keys that change when the
content behind a model name changes. Normative text: ``spec/semantic.md``.

>>> fp = fingerprint("path/to/model")                  # doctest: +SKIP
>>> fp.cache_key("kv")                                 # doctest: +SKIP
'3f2a9c0d51e87b64/kv/9b1e...'
"""

from __future__ import annotations

from ._canonical import (
    ADAPTER_CONFIG_DROPPED,
    CONFIG_DROPPED,
    KV_CONFIG_DROPPED,
    LORA_DEFAULTS,
    PROCESSOR_FILES,
    TOKENIZER_DROPPED,
    canonical_json,
)
from ._errors import CacheKindError, FingerprintFormatError, NotAModelError, SemanticError
from ._files import (
    CODE_PATTERNS,
    INERT_PATHS,
    INERT_PATTERNS,
    SENTENCE_TRANSFORMERS_PATTERNS,
    TOKENIZER_ONLY_PATTERNS,
)
from ._model import CACHE_KINDS, FORMAT, ModelFingerprint
from ._reader import fingerprint, fingerprint_files
from ._task import task_from_class
from ._tensors import graph_hash, stamp_trust

__all__ = [
    "ADAPTER_CONFIG_DROPPED",
    "CACHE_KINDS",
    "CODE_PATTERNS",
    "CONFIG_DROPPED",
    "FORMAT",
    "INERT_PATHS",
    "INERT_PATTERNS",
    "KV_CONFIG_DROPPED",
    "LORA_DEFAULTS",
    "PROCESSOR_FILES",
    "SENTENCE_TRANSFORMERS_PATTERNS",
    "TOKENIZER_DROPPED",
    "TOKENIZER_ONLY_PATTERNS",
    "CacheKindError",
    "FingerprintFormatError",
    "ModelFingerprint",
    "NotAModelError",
    "SemanticError",
    "canonical_json",
    "fingerprint",
    "fingerprint_files",
    "graph_hash",
    "stamp_trust",
    "task_from_class",
]
