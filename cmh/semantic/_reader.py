"""Fingerprinting a model or adapter directory from its headers and small JSON files."""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .._checkpoint import DEFAULT_INDEX, INDEX_SUFFIX, parse_index
from .._errors import CMHError
from ._canonical import (
    CODE_DOMAIN,
    EMBEDDING_DOMAIN,
    GENERATION_DOMAIN,
    MAX_JSON_SIZE,
    PROCESSOR_DOMAIN,
    QUANT_DOMAIN,
    TOKENIZER_DOMAIN,
    SmallFile,
    adapter_config_hash,
    canonical_json,
    chat_template_view,
    config_hash,
    files_hash,
    kv_config_hash,
    normalize_config,
    raw_files_hash,
    read_json,
    read_json_object,
    read_small,
    tokenizer_view_of_config,
)
from ._errors import NotAModelError, SemanticError
from ._files import (
    ADAPTER_CONFIG_FILE,
    CONFIG_FILE,
    MODULES_FILE,
    SKIPPED_DIRS,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
    GroupingInputs,
    auto_map_references,
    fast_tokenizer_files,
    group_files,
    is_config_file,
    module_dirs,
    referenced_path_reasons,
)
from ._model import ModelFingerprint
from ._task import adapter_task, model_task
from ._tensors import TensorSummary, summarize

ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
#: transformers' ``SAFE_WEIGHTS_NAME``: loaded in preference to any index.
SINGLE_WEIGHTS_FILE = "model.safetensors"
#: config.json's member naming the weight file (or index) transformers loads instead.
TRANSFORMERS_WEIGHTS = "transformers_weights"
#: transformers' ``WEIGHTS_NAME`` and ``WEIGHTS_INDEX_NAME``: loaded when no safetensors
#: set of its own names is there.
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
#: Mistral's native single file, read only by Mistral's own loaders.
CONSOLIDATED_PREFIX = "consolidated"
#: Bound on the files listed under one model directory (a runaway tree is refused).
MAX_FILES = 100_000

PathLike = str | os.PathLike[str]
#: An index without ``metadata.dtype``.
_ABSENT = object()


def is_skipped(path: str) -> bool:
    """Whether a repository path lies in a folder that is never read (1): the one rule for
    a directory's listing and for a path-to-bytes map (a mirror's store) alike."""
    return any(part in SKIPPED_DIRS for part in path.split("/")[:-1])


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
    """Every file under ``directory`` by repository path (``a/b.py``), symlinks followed."""
    out: dict[str, str] = {}

    def failed(exc: OSError) -> None:
        raise NotAModelError(f"cannot list directory: {exc.strerror or exc}", directory) from exc

    for here, dirs, names in os.walk(directory, onerror=failed, followlinks=True):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]  # pruned early: is_skipped
        rel = os.path.relpath(here, directory)
        for name in names:
            full = os.path.join(here, name)
            if not os.path.isfile(full):
                continue
            out[name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")] = full
            if len(out) > MAX_FILES:
                raise NotAModelError(f"more than {MAX_FILES} files", directory)
    return out


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
    ``"model-00001-of-00002.safetensors"``, ``"1_Pooling/config.json"``) to where its
    bytes are. Weights are top-level files; files in subfolders are code or
    sentence-transformers inputs (``spec/semantic.md`` 1.2). ``weight_files`` restricts the
    tensors to those files (the index is then not used).

    Every error about the input is a :class:`~cmh.semantic.SemanticError`
    (an invalid safetensors file or index: :class:`NotAModelError`, with the
    format library's error as its cause); an ``OSError`` means a file could
    not be read while hashing.
    """
    top = {name: path for name, path in files.items() if not is_skipped(name)}
    try:
        if ADAPTER_CONFIG_FILE in top and weight_files is None:
            fp = _adapter(top, threads, source)
            embedded = _embedded_base(top, threads, source) if base is None else None
            if embedded is not None:  # transformers loads the base from the directory
                fp = fp.with_base(embedded)
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
    config: dict[str, Any] | None = None
    if CONFIG_FILE in top:
        config = read_json_object(top[CONFIG_FILE], CONFIG_FILE)
    selected = (
        _select_weights(top, source, config) if weight_files is None else _WeightSet(weight_files)
    )
    weight_files, index_name = selected.files, selected.index
    missing = [name for name in weight_files if name not in top]
    if missing:
        raise NotAModelError(
            f"{index_name or 'input'} names a missing shard {missing[0]!r}", source
        )
    summary = summarize(
        {n: top[n] for n in weight_files}, selected.weight_map, threads=threads, source=source
    )
    family = _family(config)
    hashed = None
    if config is not None and normalize_config(config).get("dtype") is None:
        # the dtype the loader picks when config.json names none (5); only then is the
        # index's metadata.dtype read, as transformers reads it
        hashed = with_load_dtype(config, _load_dtype(selected, summary, source))
    elif config is not None:
        hashed = config
    small = _SmallFiles(top, config, weight_files)
    read = [*weight_files, *([index_name] if index_name else []), *small.names]
    if config is not None:
        read.append(CONFIG_FILE)
    return ModelFingerprint(
        arch=_nonempty_str(config, "model_type"),
        family=family,
        task=model_task(config or {}, family),
        config=_named(CONFIG_FILE, config_hash, hashed),
        kv_config=_named(CONFIG_FILE, kv_config_hash, hashed),
        files=tuple(sorted(set(read))),
        **_read_fields(summary, small),
    )


def _embedded_base(
    top: Mapping[str, PathLike], threads: int | None, source: str | None
) -> ModelFingerprint | None:
    """The model an adapter directory embeds, or None (1: an adapter with a base).

    transformers (``from_pretrained`` on a local directory holding ``adapter_config.json``)
    loads the base from the directory itself when it holds ``config.json``, not the
    ``base_model_name_or_path`` the adapter names, and then applies the adapter. It finds
    base weights by 1.1's rules 1 to 4 only; without any, it loads nothing, and the
    directory is an adapter alone (for a base the caller applies it to).
    """
    if CONFIG_FILE not in top:
        return None
    config = read_json_object(top[CONFIG_FILE], CONFIG_FILE)
    loadable = (SINGLE_WEIGHTS_FILE, DEFAULT_INDEX, *PICKLED_WEIGHTS)
    if config.get(TRANSFORMERS_WEIGHTS) is None and not any(n in top for n in loadable):
        return None
    return _model(top, threads, source, None)


def _read_fields(summary: TensorSummary, small: _SmallFiles) -> dict[str, Any]:
    """The fields a model's and an adapter's fingerprints both take from what was read."""
    return {
        "graph": summary.graph, "weights": summary.weights, "tokenizer": small.tokenizer,
        "processor": small.processor, "code": small.code, "embedding": small.embedding,
        "generation": small.generation, "quant_config": small.quant_config,
        "missing_code": small.refs.missing_model_code,
        "missing_tokenizer_code": small.refs.missing_tokenizer_code,
        "missing_processor_code": small.refs.missing_processor_code,
        "missing_embedding_code": small.refs.missing_embedding_code,
        "tensor_count": summary.tensor_count, "tensor_bytes": summary.tensor_bytes,
        "hashed_files": summary.hashed_files, "untrusted_stamps": summary.untrusted_stamps,
    }  # fmt: skip


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
    # the adapter's own config.json, when present, is read as a model's is (1.2, 6): its
    # auto_map names code, and it decides the tokenizer class, embedded base or not (8)
    config = read_json_object(top[CONFIG_FILE], CONFIG_FILE) if CONFIG_FILE in top else None
    small = _SmallFiles(top, config, (ADAPTER_WEIGHTS_FILE,))
    own = [CONFIG_FILE] if config is not None else []
    peft_type = _nonempty_str(adapter_config, "peft_type")
    return ModelFingerprint(
        arch=None,
        family=None,
        task=adapter_task(adapter_config),
        config=_named(ADAPTER_CONFIG_FILE, adapter_config_hash, adapter_config),
        adapter_type=peft_type or "unknown",
        base_model=_nonempty_str(adapter_config, "base_model_name_or_path"),
        files=tuple(sorted({ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, *own, *small.names})),
        **_read_fields(summary, small),
    )


class _SmallFiles:
    """The tokenizer, processor, code, embedding, generation and quantization files of a
    directory and their ids."""

    def __init__(
        self,
        files: Mapping[str, PathLike],
        config: Mapping[str, Any] | None,
        weight_files: tuple[str, ...],
    ) -> None:
        parsed: dict[str, Any] = {CONFIG_FILE: config}
        for name in sorted(files):
            if name != CONFIG_FILE and (is_config_file(name) or name == MODULES_FILE):
                parsed[name] = read_json(files[name], name)
        tokenizer_config = parsed.get(TOKENIZER_CONFIG_FILE)
        refs = auto_map_references(parsed.items(), files)
        # special_tokens_map.json: every member becomes a tokenizer argument when
        # tokenizer_config.json has no added_tokens_decoder (chat_template, tokenizer_file)
        if SPECIAL_TOKENS_MAP_FILE in files:
            parsed[SPECIAL_TOKENS_MAP_FILE] = read_json(
                files[SPECIAL_TOKENS_MAP_FILE], SPECIAL_TOKENS_MAP_FILE
            )
        # files the loaders open by a path no id covers (outside, in a skipped folder)
        tokenizer_reasons, embedding_reasons = referenced_path_reasons(
            tokenizer_config, parsed.get(SPECIAL_TOKENS_MAP_FILE), parsed.get(MODULES_FILE)
        )
        self.refs = replace(
            refs,
            missing_tokenizer_code=_merged(refs.missing_tokenizer_code, tokenizer_reasons),
            missing_embedding_code=_merged(refs.missing_embedding_code, embedding_reasons),
        )
        groups = group_files(
            files,
            inputs=GroupingInputs(
                weight_files=weight_files,
                fast_tokenizer_files=tuple(fast_tokenizer_files(tokenizer_config)),
                module_dirs=module_dirs(parsed.get(MODULES_FILE)),
            ),
        )
        self.names = groups.names
        # code may open any file of its directory: the data files are part of the code id
        self.code = raw_files_hash(
            CODE_DOMAIN, [(n, files[n]) for n in (*groups.code, *groups.data)]
        )
        tokenizer: list[SmallFile] = [(n, files[n]) for n in groups.tokenizer]
        if self.refs.tokenizer_code and self.code is not None:
            tokenizer.append(("/code", self.code.encode()))  # the tokenizer runs the code
        if tokenizer and config is not None:
            # config.json decides the tokenizer class: its deciding members join the id
            tokenizer.append((CONFIG_FILE, canonical_json(tokenizer_view_of_config(config))))
        # member order of the tokenizer's JSON decides token ids (6): kept
        self.tokenizer = files_hash(TOKENIZER_DOMAIN, tokenizer, ordered=True)
        self.processor = files_hash(PROCESSOR_DOMAIN, [(n, files[n]) for n in groups.processor])
        self.embedding = files_hash(EMBEDDING_DOMAIN, [(n, files[n]) for n in groups.embedding])
        self.quant_config = files_hash(QUANT_DOMAIN, [(n, files[n]) for n in groups.quant])
        generation: list[SmallFile] = [(n, files[n]) for n in groups.generation]
        for name, value in parsed.items():
            if name == CONFIG_FILE or name in groups.generation:
                continue
            view = chat_template_view(value)
            if view is not None:
                generation.append((name, view))  # chat_template inside a tokenizer config
        self.generation = files_hash(GENERATION_DOMAIN, generation)


def _merged(*reasons: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({reason for group in reasons for reason in group}))


@dataclass(frozen=True)
class _WeightSet:
    """The weight files a loader reads, and what decides the dtype it loads them in."""

    files: tuple[str, ...]
    index: str | None = None
    weight_map: dict[str, str] | None = None
    #: The index's ``metadata.dtype`` as written, or ``_ABSENT`` (transformers' load dtype
    #: when config.json names none).
    index_dtype: object = _ABSENT


def _select_weights(
    top: Mapping[str, PathLike], source: str | None, config: Mapping[str, Any] | None
) -> _WeightSet:
    """The weight files a loader reads, in transformers' order of precedence (1.1).

    config.json's ``transformers_weights`` (the file or index transformers loads), else
    ``model.safetensors``, else the shards of ``model.safetensors.index.json``; a folder
    transformers would load ``pytorch_model.bin`` (or its index) from is refused; else the
    shards of the only other ``*.safetensors.index.json``, else every top-level
    ``*.safetensors`` but Mistral's ``consolidated*.safetensors`` (taken only when nothing
    else is there).
    """
    explicit = _explicit_weights(top, source, config)
    if explicit is not None:
        if explicit.endswith(INDEX_SUFFIX):
            return _from_index(top, explicit, source)
        return _WeightSet((explicit,))
    if SINGLE_WEIGHTS_FILE in top:
        return _WeightSet((SINGLE_WEIGHTS_FILE,))
    if DEFAULT_INDEX in top:
        return _from_index(top, DEFAULT_INDEX, source)
    pickled = [name for name in PICKLED_WEIGHTS if name in top]
    if pickled:
        raise NotAModelError(
            f"transformers loads {pickled[0]} here (no model.safetensors and no "
            f"{DEFAULT_INDEX}), a PyTorch pickle this reader does not read",
            source,
        )
    top = {name: path for name, path in top.items() if "/" not in name}  # weights: top level
    indexes = sorted(name for name in top if name.endswith(INDEX_SUFFIX))
    if len(indexes) > 1:
        raise NotAModelError(
            f"several safetensors indexes and none is {DEFAULT_INDEX}: "
            f"{', '.join(indexes)}; which one is loaded is not known",
            source,
        )
    if indexes:
        return _from_index(top, indexes[0], source)
    shards = sorted(name for name in top if name.endswith(".safetensors"))
    loaded = [name for name in shards if not name.startswith(CONSOLIDATED_PREFIX)]
    if not shards:
        raise NotAModelError("no *.safetensors weights and no safetensors index", source)
    return _WeightSet(tuple(loaded or shards))


def _explicit_weights(
    top: Mapping[str, PathLike], source: str | None, config: Mapping[str, Any] | None
) -> str | None:
    """The repository path config.json's ``transformers_weights`` names, or None."""
    value = (config or {}).get(TRANSFORMERS_WEIGHTS)
    if value is None:
        return None
    if not isinstance(value, str) or not value.endswith((".safetensors", INDEX_SUFFIX)):
        raise NotAModelError(
            f"config.json {TRANSFORMERS_WEIGHTS} is {value!r}: transformers loads a "
            "PyTorch pickle or nothing from it, and this reader reads safetensors only",
            source,
        )
    name = posixpath.normpath(value)
    if name not in top or name.startswith(("/", "../")):
        raise NotAModelError(
            f"config.json {TRANSFORMERS_WEIGHTS} names {value!r}, which the directory lacks",
            source,
        )
    return name


def _from_index(top: Mapping[str, PathLike], index: str, source: str | None) -> _WeightSet:
    raw = read_small(top[index], index, MAX_JSON_SIZE)
    # the format specification's index rules b to f (1.1 rule 3): strict UTF-8 without a
    # byte-order mark, one object, no name twice, no NaN, a non-empty weight_map of strings
    # (an empty one names no weight file: rule 7). Not rule g: transformers_weights' index
    # names shards by paths relative to the directory (rule 1).
    weight_map = parse_index(raw, index)
    metadata = json.loads(raw).get("metadata")
    dtype = metadata["dtype"] if isinstance(metadata, dict) and "dtype" in metadata else _ABSENT
    return _WeightSet(tuple(sorted(set(weight_map.values()))), index, weight_map, dtype)


def _load_dtype(selected: _WeightSet, summary: TensorSummary, source: str | None) -> str:
    """The dtype transformers loads the weights in when config.json names none (5): the
    index's ``metadata.dtype`` (which must then be a string), else the first file's."""
    dtype = selected.index_dtype
    if dtype is _ABSENT:
        return summary.first_file_dtype
    if not isinstance(dtype, str):
        raise NotAModelError(
            f"{selected.index} metadata.dtype is {dtype!r}, not a dtype name: the load dtype "
            "is not known",
            source,
        )
    return dtype or summary.first_file_dtype


def with_load_dtype(config: Mapping[str, Any], load_dtype: str) -> dict[str, Any]:
    """``config`` with ``dtype`` set to ``load_dtype`` when it names no dtype itself (5):
    the dtype transformers loads the weights in, which decides every value computed."""
    out = dict(config)
    if normalize_config(out).get("dtype") is None:
        out.pop("torch_dtype", None)
        out["dtype"] = load_dtype
    return out


def _nonempty_str(obj: Mapping[str, Any] | None, key: str) -> str | None:
    value = (obj or {}).get(key)
    return value if isinstance(value, str) and value else None


def _family(config: Mapping[str, Any] | None) -> str | None:
    architectures = (config or {}).get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0] or None
    return None


def _named(
    name: str, digest: Callable[[Mapping[str, Any]], str], obj: Mapping[str, Any] | None
) -> str | None:
    """``digest(obj)``, with the file named in a canonicalization error; None without obj."""
    if obj is None:
        return None
    try:
        return digest(obj)
    except NotAModelError as exc:
        raise NotAModelError(f"{name}: {exc.reason}") from exc
