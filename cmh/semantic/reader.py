"""Fingerprinting a model or adapter directory from its headers and small JSON files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..checkpoint import DEFAULT_INDEX, INDEX_SUFFIX
from ..errors import CMHError
from .canonical import (
    TOKENIZER_FILES,
    adapter_config_hash,
    config_hash,
    read_json_object,
    tokenizer_hash,
)
from .errors import NotAModelError, SemanticError
from .model import ModelFingerprint
from .task import adapter_task, model_task
from .tensors import summarize

CONFIG_FILE = "config.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"

PathLike = str | os.PathLike[str]


def fingerprint(
    path_or_snapshot: PathLike,
    *,
    base: PathLike | ModelFingerprint | None = None,
    threads: int | None = None,
) -> ModelFingerprint:
    """Fingerprint the model or adapter at ``path_or_snapshot``.

    A directory (a model directory or a Hub cache snapshot) is read whole: its
    shards (``*.safetensors.index.json`` if present, else every top-level
    ``*.safetensors``), ``config.json`` and tokenizer files. A path to one
    ``.safetensors`` file takes the tensors of that file only, and the JSON
    files beside it. A directory with ``adapter_config.json`` is an adapter;
    ``base`` (a path or a fingerprint) is the model it applies to.

    Only headers and small JSON files are read when every weight file is
    stamped with a manifest that agrees with its record; other weight files
    are hashed (named in ``hashed_files``).
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
                base_fp = base if isinstance(base, ModelFingerprint) else fingerprint(base)
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
    tokenizer_files = _tokenizer_files(top)
    read = [*weight_files, *([index_name] if index_name else []), *tokenizer_files]
    if config is not None:
        read.append(CONFIG_FILE)
    return ModelFingerprint(
        arch=_nonempty_str(config, "model_type"),
        family=family,
        task=model_task(config or {}, family),
        graph=summary.graph,
        weights=summary.weights,
        tokenizer=tokenizer_hash((n, top[n]) for n in tokenizer_files),
        config=config_hash(config) if config is not None else None,
        tensor_count=summary.tensor_count,
        tensor_bytes=summary.tensor_bytes,
        files=tuple(sorted(read)),
        hashed_files=summary.hashed_files,
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
    tokenizer_files = _tokenizer_files(top)
    peft_type = _nonempty_str(adapter_config, "peft_type")
    return ModelFingerprint(
        arch=None,
        family=None,
        task=adapter_task(adapter_config),
        graph=summary.graph,
        weights=summary.weights,
        tokenizer=tokenizer_hash((n, top[n]) for n in tokenizer_files),
        config=adapter_config_hash(adapter_config),
        adapter_type=peft_type or "unknown",
        base_model=_nonempty_str(adapter_config, "base_model_name_or_path"),
        tensor_count=summary.tensor_count,
        tensor_bytes=summary.tensor_bytes,
        files=tuple(sorted([ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, *tokenizer_files])),
        hashed_files=summary.hashed_files,
    )


def _select_weights(
    top: Mapping[str, PathLike], source: str | None
) -> tuple[tuple[str, ...], str | None, dict[str, str] | None]:
    """The format library's rule: the index's shards, else every top-level ``*.safetensors``."""
    indexes = sorted(name for name in top if name.endswith(INDEX_SUFFIX))
    if indexes:
        index = DEFAULT_INDEX if DEFAULT_INDEX in indexes else indexes[0]
        obj = read_json_object(top[index], index)
        weight_map = obj.get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise NotAModelError(f"{index} has no weight_map of tensor name to file name", source)
        return tuple(sorted(set(weight_map.values()))), index, dict(weight_map)
    shards = tuple(sorted(name for name in top if name.endswith(".safetensors")))
    if not shards:
        raise NotAModelError("no *.safetensors weights and no safetensors index", source)
    return shards, None, None


def _tokenizer_files(top: Mapping[str, PathLike]) -> list[str]:
    return [name for name in TOKENIZER_FILES if name in top]


def _nonempty_str(obj: Mapping[str, Any] | None, key: str) -> str | None:
    value = (obj or {}).get(key)
    return value if isinstance(value, str) and value else None


def _family(config: Mapping[str, Any] | None) -> str | None:
    architectures = (config or {}).get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0] or None
    return None
