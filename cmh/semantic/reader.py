"""Fingerprinting a model or adapter directory from its headers and small JSON files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..checkpoint import DEFAULT_INDEX, INDEX_SUFFIX
from ..errors import CMHError
from .canonical import (
    adapter_config_hash,
    code_file_names,
    code_hash,
    config_hash,
    kv_config_hash,
    processor_file_names,
    processor_hash,
    read_json_object,
    tokenizer_file_names,
    tokenizer_hash,
)
from .errors import NotAModelError, SemanticError
from .model import ModelFingerprint
from .task import adapter_task, model_task
from .tensors import summarize

CONFIG_FILE = "config.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
#: transformers' ``SAFE_WEIGHTS_NAME``: loaded in preference to any index.
SINGLE_WEIGHTS_FILE = "model.safetensors"
#: Mistral's native single file, read only by Mistral's own loaders.
CONSOLIDATED_PREFIX = "consolidated"

PathLike = str | os.PathLike[str]


def fingerprint(
    path_or_snapshot: PathLike,
    *,
    base: PathLike | ModelFingerprint | None = None,
    threads: int | None = None,
) -> ModelFingerprint:
    """Fingerprint the model or adapter at ``path_or_snapshot``.

    A directory (a model directory or a Hub cache snapshot) is read as
    transformers loads it: ``model.safetensors`` if present, else the shards of
    ``model.safetensors.index.json`` (the full rule is in ``spec/semantic.md``
    1.1), with ``config.json``, the tokenizer, processor and code files. A
    path to one ``.safetensors`` file takes the tensors of that file only, and
    the small files beside it. A directory with ``adapter_config.json`` is an adapter;
    ``base`` (a path or a fingerprint) is the model it applies to.

    Only headers and small files are read when every weight file carries a
    stamp that may be trusted (``spec/semantic.md`` 2.1: manifest agrees with
    the record, not expired, not modified since stamped); other weight files
    are hashed (named in ``hashed_files``; ``untrusted_stamps`` says why a
    stamp was not used).
    """
    target = os.fspath(path_or_snapshot)
    if os.path.isdir(target):
        return fingerprint_files(_listing(target), base=base, threads=threads, source=target)
    if os.path.isfile(target):
        name = os.path.basename(target)
        if not name.endswith(".safetensors"):
            raise NotAModelError("not a directory or a .safetensors file", target)
        siblings = _listing(os.path.dirname(os.path.abspath(target)))
        return fingerprint_files(
            siblings, base=base, threads=threads, source=target, weight_files=(name,)
        )
    raise NotAModelError("no such file or directory", target)


def _listing(directory: str) -> dict[str, str]:
    try:
        with os.scandir(directory) as it:
            return {e.name: os.path.join(directory, e.name) for e in it if e.is_file()}
    except OSError as exc:
        raise NotAModelError(f"cannot list directory: {exc.strerror or exc}", directory) from exc


def fingerprint_files(
    files: Mapping[str, PathLike],
    *,
    base: PathLike | ModelFingerprint | None = None,
    threads: int | None = None,
    source: str | None = None,
    weight_files: tuple[str, ...] | None = None,
) -> ModelFingerprint:
    """Fingerprint a model given as repository file names mapped to local paths.

    For callers whose files are not laid out as a directory (a mirror's
    content-addressed store): ``files`` maps each repository path (``"config.json"``,
    ``"model-00001-of-00002.safetensors"``) to where its bytes are. Names with a
    ``/`` (files in subfolders) are ignored. ``weight_files`` restricts the
    tensors to those files (the index is then not used).

    Every error about the input is a :class:`~cmh.semantic.SemanticError`
    (an invalid safetensors file or index: :class:`NotAModelError`, with the
    format library's error as its cause); an ``OSError`` means a file could
    not be read while hashing.
    """
    top = {name: path for name, path in files.items() if "/" not in name}
    try:
        if ADAPTER_CONFIG_FILE in top:
            fp = _adapter(top, threads, source)
            if base is not None:
                base_fp = (
                    base
                    if isinstance(base, ModelFingerprint)
                    else fingerprint(base, threads=threads)
                )
                fp = fp.with_base(base_fp)
            return fp
        if base is not None:
            raise SemanticError(f"{source or 'input'}: a base applies to adapter directories only")
        return _model(top, threads, source, weight_files)
    except SemanticError:
        raise
    except CMHError as exc:  # an invalid weight file or index: not a readable model
        raise NotAModelError(str(exc)) from exc


def _model(
    top: Mapping[str, PathLike],
    threads: int | None,
    source: str | None,
    weight_files: tuple[str, ...] | None,
) -> ModelFingerprint:
    weight_map: dict[str, str] | None = None
    index_name: str | None = None
    if weight_files is None:
        weight_files, index_name, weight_map = _select_weights(top, source)
    missing = [name for name in weight_files if name not in top]
    if missing:
        raise NotAModelError(
            f"{index_name or 'input'} names a missing shard {missing[0]!r}", source
        )
    summary = summarize(
        {n: top[n] for n in weight_files}, weight_map, threads=threads, source=source
    )
    config: dict[str, Any] | None = None
    if CONFIG_FILE in top:
        config = read_json_object(top[CONFIG_FILE], CONFIG_FILE)
    family = _family(config)
    small = _SmallFiles(top)
    read = [*weight_files, *([index_name] if index_name else []), *small.names]
    if config is not None:
        read.append(CONFIG_FILE)
    return ModelFingerprint(
        arch=_nonempty_str(config, "model_type"),
        family=family,
        task=model_task(config or {}, family),
        graph=summary.graph,
        weights=summary.weights,
        tokenizer=small.tokenizer,
        config=config_hash(config) if config is not None else None,
        kv_config=kv_config_hash(config) if config is not None else None,
        processor=small.processor,
        code=small.code,
        tensor_count=summary.tensor_count,
        tensor_bytes=summary.tensor_bytes,
        files=tuple(sorted(read)),
        hashed_files=summary.hashed_files,
        untrusted_stamps=summary.untrusted_stamps,
    )


def _adapter(
    top: Mapping[str, PathLike], threads: int | None, source: str | None
) -> ModelFingerprint:
    if ADAPTER_WEIGHTS_FILE not in top:
        raise NotAModelError(
            f"{ADAPTER_CONFIG_FILE} without {ADAPTER_WEIGHTS_FILE} (only safetensors adapters "
            "are read)",
            source,
        )
    adapter_config = read_json_object(top[ADAPTER_CONFIG_FILE], ADAPTER_CONFIG_FILE)
    summary = summarize(
        {ADAPTER_WEIGHTS_FILE: top[ADAPTER_WEIGHTS_FILE]}, threads=threads, source=source
    )
    small = _SmallFiles(top)
    peft_type = _nonempty_str(adapter_config, "peft_type")
    return ModelFingerprint(
        arch=None,
        family=None,
        task=adapter_task(adapter_config),
        graph=summary.graph,
        weights=summary.weights,
        tokenizer=small.tokenizer,
        config=adapter_config_hash(adapter_config),
        processor=small.processor,
        code=small.code,
        adapter_type=peft_type or "unknown",
        base_model=_nonempty_str(adapter_config, "base_model_name_or_path"),
        tensor_count=summary.tensor_count,
        tensor_bytes=summary.tensor_bytes,
        files=tuple(sorted([ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, *small.names])),
        hashed_files=summary.hashed_files,
        untrusted_stamps=summary.untrusted_stamps,
    )


class _SmallFiles:
    """The tokenizer, processor and code files of a directory and their hashes."""

    def __init__(self, top: Mapping[str, PathLike]) -> None:
        tokenizer = tokenizer_file_names(top)
        processor = processor_file_names(top)
        code = code_file_names(top)
        self.names = sorted({*tokenizer, *processor, *code})
        self.tokenizer = tokenizer_hash((n, top[n]) for n in tokenizer)
        self.processor = processor_hash((n, top[n]) for n in processor)
        self.code = code_hash((n, top[n]) for n in code)


def _select_weights(
    top: Mapping[str, PathLike], source: str | None
) -> tuple[tuple[str, ...], str | None, dict[str, str] | None]:
    """The weight files a loader reads, in transformers' order of precedence.

    ``model.safetensors``, else the shards of ``model.safetensors.index.json``,
    else the shards of the only other ``*.safetensors.index.json``, else every
    top-level ``*.safetensors`` but Mistral's ``consolidated*.safetensors``
    (taken only when nothing else is there).
    """
    if SINGLE_WEIGHTS_FILE in top:
        return (SINGLE_WEIGHTS_FILE,), None, None
    indexes = sorted(name for name in top if name.endswith(INDEX_SUFFIX))
    if DEFAULT_INDEX not in indexes and len(indexes) > 1:
        raise NotAModelError(
            f"several safetensors indexes and none is {DEFAULT_INDEX}: "
            f"{', '.join(indexes)}; which one is loaded is not known",
            source,
        )
    if indexes:
        index = DEFAULT_INDEX if DEFAULT_INDEX in indexes else indexes[0]
        obj = read_json_object(top[index], index)
        weight_map = obj.get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise NotAModelError(f"{index} has no weight_map of tensor name to file name", source)
        return tuple(sorted(set(weight_map.values()))), index, dict(weight_map)
    shards = sorted(name for name in top if name.endswith(".safetensors"))
    loaded = [name for name in shards if not name.startswith(CONSOLIDATED_PREFIX)]
    if not shards:
        raise NotAModelError("no *.safetensors weights and no safetensors index", source)
    return tuple(loaded or shards), None, None


def _nonempty_str(obj: Mapping[str, Any] | None, key: str) -> str | None:
    value = (obj or {}).get(key)
    return value if isinstance(value, str) and value else None


def _family(config: Mapping[str, Any] | None) -> str | None:
    architectures = (config or {}).get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0] or None
    return None
