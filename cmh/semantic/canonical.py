"""Canonical JSON and the hashes of the small files: config, tokenizer, adapter config.

JSON is canonicalized with RFC 8785 (JSON Canonicalization Scheme) after a
pre-pass that makes every Python-readable JSON value representable: numbers
are IEEE-754 doubles in RFC 8785, so an integer beyond 2**53 - 1 becomes its
nearest double, and the non-standard ``NaN``/``Infinity`` tokens become
strings. Fields that do not change what a model computes are dropped first
(the lists below are normative: ``spec/semantic.md`` repeats them).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import rfc8785

from .errors import NotAModelError

CONFIG_DOMAIN = b"CMH-SEM-CONFIG-v1\n"
ADAPTER_CONFIG_DOMAIN = b"CMH-SEM-ADAPTER-CONFIG-v1\n"
TOKENIZER_DOMAIN = b"CMH-SEM-TOKENIZER-v1\n"

MAX_JSON_SIZE = 64 << 20
MAX_TOKENIZER_FILE_SIZE = 512 << 20
SAFE_INTEGER = (1 << 53) - 1

#: ``config.json`` fields that do not change what the model computes at inference.
CONFIG_DROPPED: frozenset[str] = frozenset(
    {
        # provenance and loader bookkeeping
        "_name_or_path",
        "_commit_hash",
        "transformers_version",
        "_attn_implementation_autoset",
        "finetuning_task",
        # runtime switches that change what is returned or kept, not its values
        "use_cache",
        "gradient_checkpointing",
        "output_hidden_states",
        "return_dict",
        # training only: initialization and dropout (identity at inference)
        "initializer_range",
        "initializer_factor",
        "attention_dropout",
        "attention_probs_dropout_prob",
        "hidden_dropout",
        "hidden_dropout_prob",
        "activation_dropout",
        "classifier_dropout",
        "dropout",
        "embd_pdrop",
        "attn_pdrop",
        "resid_pdrop",
        "summary_first_dropout",
        "layerdrop",
        "encoder_layerdrop",
        "decoder_layerdrop",
    }
)

#: ``adapter_config.json`` fields that do not change what the adapted model computes.
#: The base model is named by ``base_model`` on the fingerprint instead.
ADAPTER_CONFIG_DROPPED: frozenset[str] = frozenset(
    {
        "base_model_name_or_path",
        "revision",
        "inference_mode",
        "init_lora_weights",
        "lora_dropout",
        "peft_version",
    }
)

#: ``adapter_config.json`` members that PEFT stores from Python sets: a list of strings
#: there is sorted, since its written order varies between processes.
ADAPTER_CONFIG_SETS: frozenset[str] = frozenset(
    {"target_modules", "modules_to_save", "exclude_modules", "target_parameters"}
)

#: Tokenizer files covered by the ``tokenizer`` hash (top level of the model directory).
TOKENIZER_FILES: tuple[str, ...] = (
    "added_tokens.json",
    "bpe.codes",
    "merges.txt",
    "sentencepiece.bpe.model",
    "source.spm",
    "special_tokens_map.json",
    "spiece.model",
    "target.spm",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)

#: Top-level members dropped from ``tokenizer_config.json`` and ``special_tokens_map.json``:
#: where the tokenizer was loaded from, loader options, and the chat template (which
#: renders messages to text, not text to tokens).
TOKENIZER_DROPPED: frozenset[str] = frozenset(
    {
        "_commit_hash",
        "_from_pipeline",
        "_name_or_path",
        "cache_dir",
        "chat_template",
        "force_download",
        "is_local",
        "local_files_only",
        "name_or_path",
        "proxies",
        "revision",
        "special_tokens_map_file",
        "subfolder",
        "token",
        "tokenizer_file",
        "transformers_version",
        "trust_remote_code",
        "use_auth_token",
    }
)

_TOKENIZER_JSON_DROPS: dict[str, frozenset[str]] = {
    "tokenizer_config.json": TOKENIZER_DROPPED,
    "special_tokens_map.json": TOKENIZER_DROPPED,
}


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of a parsed JSON value, after the number pre-pass."""
    return rfc8785.dumps(_representable(value))


def _representable(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if abs(value) <= SAFE_INTEGER:
            return value
        try:
            return float(value)
        except OverflowError:
            return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, Mapping):
        return {str(k): _representable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_representable(v) for v in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def read_json(path: str | os.PathLike[str], name: str) -> Any:
    """Parse a small JSON file; a bad one raises :class:`NotAModelError` naming ``name``."""
    data = _read_small(path, name, MAX_JSON_SIZE)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise NotAModelError(f"{name} is not valid JSON: {exc}", os.fspath(path)) from exc


def read_json_object(path: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """Like :func:`read_json`, for files that must hold a JSON object."""
    obj = read_json(path, name)
    if not isinstance(obj, dict):
        raise NotAModelError(f"{name} does not hold a JSON object", os.fspath(path))
    return obj


def _read_small(path: str | os.PathLike[str], name: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise NotAModelError(f"{name} is {size} bytes, over the {limit}-byte limit")
            return f.read(limit + 1)
    except OSError as exc:
        raise NotAModelError(f"cannot read {name}: {exc.strerror or exc}", os.fspath(path)) from exc


def drop_config_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without :data:`CONFIG_DROPPED`, at top level and in nested sub-configs.

    A nested object is a sub-config when it has a ``model_type`` member (as
    ``text_config`` or ``encoder`` do); other objects (``id2label``, ...) are kept whole.
    """
    return {k: _drop_in_subconfigs(v) for k, v in config.items() if k not in CONFIG_DROPPED}


def _drop_in_subconfigs(value: Any) -> Any:
    if isinstance(value, dict):
        if "model_type" in value:
            return drop_config_fields(value)
        return {k: _drop_in_subconfigs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_drop_in_subconfigs(v) for v in value]
    return value


def config_hash(config: Mapping[str, Any]) -> str:
    """The ``config`` hash: SHA-256 of the domain tag and the canonical reduced config."""
    return hashlib.sha256(CONFIG_DOMAIN + canonical_json(drop_config_fields(config))).hexdigest()


def adapter_config_hash(config: Mapping[str, Any]) -> str:
    """The ``config`` hash of an adapter, over ``adapter_config.json`` reduced."""
    reduced = {k: v for k, v in config.items() if k not in ADAPTER_CONFIG_DROPPED}
    for key in ADAPTER_CONFIG_SETS & reduced.keys():
        value = reduced[key]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            reduced[key] = sorted(value, key=lambda v: v.encode())
    return hashlib.sha256(ADAPTER_CONFIG_DOMAIN + canonical_json(reduced)).hexdigest()


def tokenizer_file_content(path: str | os.PathLike[str], name: str) -> bytes:
    """The canonical content of one tokenizer file: canonical JSON, else the raw bytes."""
    if not name.endswith(".json"):
        return _read_small(path, name, MAX_TOKENIZER_FILE_SIZE)
    value = read_json(path, name)
    dropped = _TOKENIZER_JSON_DROPS.get(name)
    if dropped is not None and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in dropped}
    return canonical_json(value)


def tokenizer_hash(files: Iterable[tuple[str, str | os.PathLike[str]]]) -> str | None:
    """The ``tokenizer`` hash over ``(name, path)`` pairs of tokenizer files; ``None`` if none."""
    items = sorted(((name.encode(), name, path) for name, path in files), key=lambda x: x[0])
    if not items:
        return None
    h = hashlib.sha256(TOKENIZER_DOMAIN)
    h.update(struct.pack("<I", len(items)))
    for encoded, name, path in items:
        content = tokenizer_file_content(path, name)
        h.update(struct.pack("<I", len(encoded)) + encoded)
        h.update(struct.pack("<Q", len(content)) + content)
    return h.hexdigest()
