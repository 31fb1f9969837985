"""Canonical JSON and the hashes of the small files: config, tokenizer, adapter config.

JSON is canonicalized with RFC 8785 (JSON Canonicalization Scheme), with number
forms for the values RFC 8785's doubles cannot tell apart (an integer beyond 2**53 - 1
that is not a double, a negative zero, ``NaN``/``Infinity``): each is written in a form
no RFC 8785 text holds. Fields that do not change what a model computes are dropped first
(the lists below are normative: ``spec/semantic.md`` repeats them).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from collections.abc import Iterable, Mapping
from itertools import accumulate
from typing import Any

import rfc8785

from ._errors import NotAModelError

CONFIG_DOMAIN = b"CMH-SEM-CONFIG-v3\n"
KV_CONFIG_DOMAIN = b"CMH-SEM-KV-CONFIG-v3\n"
ADAPTER_CONFIG_DOMAIN = b"CMH-SEM-ADAPTER-CONFIG-v3\n"
TOKENIZER_DOMAIN = b"CMH-SEM-TOKENIZER-v3\n"
PROCESSOR_DOMAIN = b"CMH-SEM-PROCESSOR-v3\n"
CODE_DOMAIN = b"CMH-SEM-CODE-v3\n"
EMBEDDING_DOMAIN = b"CMH-SEM-EMBEDDING-v3\n"
GENERATION_DOMAIN = b"CMH-SEM-GENERATION-v3\n"
QUANT_DOMAIN = b"CMH-SEM-QUANT-v3\n"

#: ``config.json`` members the tokenizer loading code reads (``AutoTokenizer``: the class
#: from ``model_type``, ``model_name`` and ``tokenizer_class``, the code ``auto_map``
#: names; the Mistral regex fix from ``transformers_version`` and ``model_type``): the
#: only part of ``config.json`` in the ``tokenizer`` id. Checked by a recording config.
TOKENIZER_CONFIG_MEMBERS: tuple[str, ...] = (
    "auto_map",
    "model_name",
    "model_type",
    "tokenizer_class",
    "transformers_version",
)

MAX_JSON_SIZE = 64 << 20
#: Arrays and objects nested deeper than this in a JSON file are an error (4): a fixed
#: bound, where Python's parser stops at a depth that moves with the caller's stack.
MAX_JSON_DEPTH = 256
#: An integer token of more digits is an error (4): Python's default bound, under which
#: transformers' ``json.load`` refuses such a file too, applied whatever
#: ``PYTHONINTMAXSTRDIGITS`` says.
MAX_INTEGER_DIGITS = 4300
#: Digits converted at once (under Python's least ``int``/``str`` bound, 640), so no
#: conversion depends on the process's bound.
_DIGIT_CHUNK = 600
MAX_SMALL_FILE_SIZE = 512 << 20
SAFE_INTEGER = (1 << 53) - 1
UTF8_BOM = b"\xef\xbb\xbf"
#: Strict UTF-8 text holds a surrogate only through a ``\\uD800``-``\\uDFFF`` escape.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

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
        # (not output_hidden_states: sentence-transformers passes every layer's hidden
        # states to its modules only when it is true, and WeightedLayerPooling pools them)
        "use_cache",
        "gradient_checkpointing",
        "return_dict",
        # training only: dropout (identity at inference). Not initializer_range or
        # initializer_factor: transformers initializes a weight the checkpoint lacks from
        # them, deterministically where the class says so (T5's layer norms).
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
        "dropout_rate",
        # training only: SpecAugment masking (off in eval mode)
        "apply_spec_augment",
        "mask_time_prob",
        "mask_time_length",
        "mask_time_min_masks",
        "mask_feature_prob",
        "mask_feature_length",
        "mask_feature_min_masks",
        # not id2label, label2id or problem_type: from_pretrained sizes a classification
        # head the checkpoint lacks from len(id2label) (another graph), and pipelines read
        # them (label names, softmax or sigmoid, the entailment id of zero-shot)
    }
)

#: Fields dropped for the ``kv`` id beyond :data:`CONFIG_DROPPED`: none. Up to v2 the
#: token ids and ``generate()`` settings were dropped here, on the belief that no layer
#: reads them; transformers models do (a forward pass reading ``eos_token_id``), so v3
#: keeps every field that is not argued inert for every kind. Kept as a name for callers.
KV_CONFIG_DROPPED: frozenset[str] = frozenset()

#: Top-level config members that transformers 5 moves into ``rope_parameters``.
ROPE_MOVED: tuple[str, ...] = ("rope_scaling", "rope_theta", "partial_rotary_factor")
#: Model types whose classes are shown (by the reference tests, with torch) to compute the
#: same outputs from the transformers 4 and 5 spellings of RoPE: only their configs are
#: normalized. Any other type keeps both spellings distinct (``dinov3_vit`` reads
#: ``rope_theta`` itself, ``gpt_neox`` ``rotary_emb_base``, ``apertus`` defaults to llama3
#: scaling when ``rope_parameters`` is absent).
ROPE_NORMALIZED_TYPES: frozenset[str] = frozenset({"llama", "mistral", "qwen2", "qwen3"})
#: RoPE types whose parameters carry ``original_max_position_embeddings``.
ROPE_WITH_ORIGINAL_LENGTH: frozenset[str] = frozenset({"llama3", "yarn", "longrope"})

#: ``adapter_config.json`` fields that do not change what the adapted model computes.
#: The base model is named by ``base_model`` on the fingerprint instead.
ADAPTER_CONFIG_DROPPED: frozenset[str] = frozenset(
    {
        "base_model_name_or_path",
        "revision",
        "inference_mode",
        "lora_dropout",
        "peft_version",
    }
)

#: LoRA fields of ``adapter_config.json`` with PEFT's default values. Older PEFT versions
#: do not write fields added later, and a field absent means its default, so a LoRA
#: config drops every member equal to its default here before hashing. Checked against
#: PEFT's own ``LoraConfig`` by the tests.
LORA_DEFAULTS: dict[str, Any] = {
    "alora_invocation_tokens": None,
    "alpha_pattern": {},
    "arrow_config": None,
    "astra_config": None,
    "auto_mapping": None,
    "bias": "none",
    "corda_config": None,
    "ensure_weight_tying": False,
    "eva_config": None,
    "exclude_modules": None,
    "fan_in_fan_out": False,
    "init_lora_weights": True,
    "kasa_config": None,
    "layer_replication": None,
    "layers_pattern": None,
    "layers_to_transform": None,
    "loftq_config": {},
    "lora_alpha": 8,
    "lora_bias": False,
    "lora_ga_config": None,
    "megatron_config": None,
    "megatron_core": "megatron.core",
    "modules_to_save": None,
    "monteclora_config": None,
    "qalora_group_size": 16,
    "r": 8,
    "rank_pattern": {},
    "target_parameters": None,
    "trainable_token_indices": None,
    "use_bdlora": None,
    "use_dora": False,
    "use_qalora": False,
    "use_rslora": False,
    "velora_config": None,
}

#: ``adapter_config.json`` members that PEFT stores from Python sets: a list of strings
#: there is sorted, since its written order varies between processes.
ADAPTER_CONFIG_SETS: frozenset[str] = frozenset(
    {"target_modules", "modules_to_save", "exclude_modules", "target_parameters"}
)

#: ``adapter_config.json`` members named ``*_pattern`` (``alpha_pattern``, ``rank_pattern``,
#: ``lambda_pattern``, ...): PEFT's ``get_pattern_key`` takes the FIRST key, in file order,
#: that matches a module name, so their order decides the scaling. An object there is
#: hashed as the list of its ``[key, value]`` pairs in file order, not with sorted members.
ADAPTER_ORDERED_SUFFIX = "_pattern"

#: Processor files, whose loader options are dropped like the tokenizer's (6).
PROCESSOR_FILES: tuple[str, ...] = (
    "audio_tokenizer_config.json",
    "feature_extractor_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)

#: Top-level members dropped from ``tokenizer_config.json`` and the processor files: where
#: the tokenizer was loaded from, loader options (transformers sets every one of them from
#: the directory or the caller after reading the file), and the chat template (which
#: renders messages to text, not text to tokens; it is in ``generation``). Not from
#: ``special_tokens_map.json``: without ``added_tokens_decoder`` in ``tokenizer_config.json``
#: transformers copies every member of that file into the tokenizer's arguments last, so a
#: ``tokenizer_file`` or ``chat_template`` there is read (6).
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

_LOADER_JSON_DROPS: dict[str, frozenset[str]] = {
    "tokenizer_config.json": TOKENIZER_DROPPED,
    **dict.fromkeys(PROCESSOR_FILES, TOKENIZER_DROPPED),
}


def canonical_json(value: Any, *, ordered: bool = False) -> bytes:
    """Canonical bytes of a parsed JSON value (4): RFC 8785, with the number forms below.

    Numbers that RFC 8785 (IEEE doubles) would merge with another value are written in a
    form no RFC 8785 text holds, so two values a loader tells apart never share bytes: an
    integer beyond 2**53 - 1 that is not exactly a double is its decimal digits followed by
    ``n`` (``1152921504606846977n``); a double negative zero is ``-0``; ``NaN``,
    ``Infinity`` and ``-Infinity`` are those bare tokens (never the strings). An integer
    that is exactly a double is written as that double (``1e+30``). ``ordered`` keeps each
    object's members in the order of the file (the tokenizer id, 6) instead of sorting them.

    Text that is not valid Unicode (a lone surrogate such as ``"\\ud800"``) raises
    :class:`NotAModelError`: it has no UTF-8 form, so no canonical form.
    """
    out: list[bytes] = []
    try:
        _serialize(value, out, ordered)
    except rfc8785.CanonicalizationError as exc:
        raise NotAModelError(f"JSON text that is not valid Unicode: {exc}") from exc
    return b"".join(out)


def _serialize(value: Any, out: list[bytes], ordered: bool) -> None:
    if value is None or isinstance(value, bool | str):
        out.append(rfc8785.dumps(value))
    elif isinstance(value, int):
        out.append(_integer(value))
    elif isinstance(value, float):
        out.append(_double(value))
    elif isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
        if not ordered:  # RFC 8785: members sorted by their UTF-16 code units
            items.sort(key=lambda kv: kv[0].encode("utf-16-be", "surrogatepass"))
        out.append(b"{")
        for i, (key, item) in enumerate(items):
            if i:
                out.append(b",")
            out.append(rfc8785.dumps(key))
            out.append(b":")
            _serialize(item, out, ordered)
        out.append(b"}")
    elif isinstance(value, list | tuple):
        out.append(b"[")
        for i, item in enumerate(value):
            if i:
                out.append(b",")
            _serialize(item, out, ordered)
        out.append(b"]")
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def _integer(value: int) -> bytes:
    """An integer: its digits up to 2**53 - 1; beyond, the double it equals exactly (in
    RFC 8785 form), else its exact digits and ``n`` (no double, so no RFC 8785 number)."""
    if abs(value) <= SAFE_INTEGER:
        return str(value).encode()
    try:
        as_double = float(value)
    except OverflowError:
        as_double = math.nan
    if as_double == value:
        return rfc8785.dumps(as_double)
    return f"{_decimal(value)}n".encode()


def _double(value: float) -> bytes:
    """A double: RFC 8785 form, but ``-0`` for negative zero and the bare tokens ``NaN``,
    ``Infinity``, ``-Infinity``, which RFC 8785 cannot write (and are never strings)."""
    if math.isnan(value):
        return b"NaN"
    if math.isinf(value):
        return b"Infinity" if value > 0 else b"-Infinity"
    if value == 0 and math.copysign(1.0, value) < 0:
        return b"-0"
    return rfc8785.dumps(value)


def read_json(path: str | os.PathLike[str], name: str) -> Any:
    """Parse a small JSON file; a bad one raises :class:`NotAModelError` naming ``name``."""
    data = read_small(path, name, MAX_JSON_SIZE)
    if data.startswith(UTF8_BOM):  # transformers' json.load refuses it too
        raise NotAModelError(f"{name} starts with a byte-order mark (not JSON)", os.fspath(path))
    try:
        text = data.decode("utf-8")  # strict: no UTF-16/32 guess, no encoded surrogate
    except UnicodeDecodeError as exc:
        raise NotAModelError(
            f"{name} is not valid UTF-8 (at byte {exc.start})", os.fspath(path)
        ) from exc
    # The text without its strings: what is left of valid JSON is numbers, literals,
    # punctuation and whitespace, so its brackets give the nesting depth and its digit
    # runs the integers (C-speed passes; a walk of a large tokenizer.json took seconds).
    skeleton = _JSON_STRING.sub('""', text)
    long_digits = _LONG_DIGITS.search(skeleton) is not None
    try:
        value = json.loads(text, parse_int=_integer_token if long_digits else None)
    except RecursionError:
        value = _TOO_DEEP
    except ValueError as exc:
        raise NotAModelError(f"{name} is not valid JSON: {exc}", os.fspath(path)) from exc
    if value is _TOO_DEEP or _nesting(skeleton) > MAX_JSON_DEPTH:
        raise NotAModelError(
            f"{name} is nested more than {MAX_JSON_DEPTH} arrays or objects deep",
            os.fspath(path),
        )
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise NotAModelError(
            f"{name} holds a lone surrogate (an escaped \\ud800 without its pair): "
            "not valid Unicode",
            os.fspath(path),
        )
    return value


_TOO_DEEP = object()
#: A JSON string (of valid JSON: an escape is a backslash and the character after it).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
#: Digits Python may refuse to convert (its least bound is 640): parsed by chunks.
_LONG_DIGITS = re.compile(f"[0-9]{{{_DIGIT_CHUNK}}}")
_NESTING_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _integer_token(token: str) -> int:
    """The integer of a JSON number token without fraction or exponent (4): exact, at most
    :data:`MAX_INTEGER_DIGITS` digits, whatever the process's ``int`` bound."""
    negative = token.startswith("-")
    digits = token[negative:]
    if len(digits) > MAX_INTEGER_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (at most {MAX_INTEGER_DIGITS})")
    value = 0
    for start in range(0, len(digits), _DIGIT_CHUNK):
        chunk = digits[start : start + _DIGIT_CHUNK]
        value = value * 10 ** len(chunk) + int(chunk)
    return -value if negative else value


def _decimal(value: int) -> str:
    """The decimal digits of ``value`` (``-`` when negative), whatever the process's bound."""
    magnitude, parts = abs(value), []
    while magnitude >= 10**_DIGIT_CHUNK:
        magnitude, low = divmod(magnitude, 10**_DIGIT_CHUNK)
        parts.append(str(low).zfill(_DIGIT_CHUNK))
    parts.append(str(magnitude))
    return ("-" if value < 0 else "") + "".join(reversed(parts))


def _nesting(skeleton: str) -> int:
    """How deep arrays and objects nest in JSON text whose strings were removed."""
    brackets = _NOT_BRACKET.sub("", skeleton)
    return max(accumulate(map(_NESTING_STEP.__getitem__, brackets)), default=0)


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in ``value`` (keys too) holds a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def read_json_object(path: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """Like :func:`read_json`, for files that must hold a JSON object."""
    obj = read_json(path, name)
    if not isinstance(obj, dict):
        raise NotAModelError(f"{name} does not hold a JSON object", os.fspath(path))
    return obj


def read_small(path: str | os.PathLike[str], name: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise NotAModelError(f"{name} is {size} bytes, over the {limit}-byte limit")
            return f.read(limit + 1)
    except OSError as exc:
        raise NotAModelError(f"cannot read {name}: {exc.strerror or exc}", os.fspath(path)) from exc


def drop_config_fields(
    config: Mapping[str, Any], dropped: frozenset[str] = CONFIG_DROPPED
) -> dict[str, Any]:
    """``config`` normalized, without ``dropped``, at top level and in nested sub-configs.

    A nested object is a sub-config when it has a ``model_type`` member (as
    ``text_config`` or ``encoder`` do); other objects are kept whole. Each
    (sub-)config is first brought to transformers 5 spelling (:func:`normalize_config`).
    """
    normalized = normalize_config(config)
    return {k: _drop_in_subconfigs(v, dropped) for k, v in normalized.items() if k not in dropped}


def _drop_in_subconfigs(value: Any, dropped: frozenset[str]) -> Any:
    if isinstance(value, dict):
        if "model_type" in value:
            return drop_config_fields(value, dropped)
        return {k: _drop_in_subconfigs(v, dropped) for k, v in value.items()}
    if isinstance(value, list):
        return [_drop_in_subconfigs(v, dropped) for v in value]
    return value


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite transformers 4 spellings of one config object as transformers 5 reads them.

    - ``torch_dtype`` is ``dtype`` (transformers 5 takes ``dtype`` when both are set;
      ``config.torch_dtype`` is a property reading ``dtype`` in every config class);
    - RoPE, for the model types of :data:`ROPE_NORMALIZED_TYPES` only:
      ``rope_parameters`` is ``rope_scaling`` if set, else ``rope_parameters``,
      with the top-level ``rope_theta`` and ``partial_rotary_factor`` moved in when
      absent there, ``rope_type`` defaulting to ``type``, else ``"default"`` (a ``type``
      equal to it is dropped), and ``original_max_position_embeddings`` defaulting to
      the top-level one, else ``max_position_embeddings``, for ``llama3``, ``yarn`` and
      ``longrope``. Parameters nested by layer type are left as they are.
    """
    out = dict(config)
    torch_dtype = out.pop("torch_dtype", None)
    if out.get("dtype") is None and torch_dtype is not None:
        out["dtype"] = torch_dtype
    if out.get("model_type") not in ROPE_NORMALIZED_TYPES:
        return out  # not shown to read both RoPE spellings alike: both kept
    if not any(out.get(k) is not None for k in (*ROPE_MOVED, "rope_parameters")):
        return out
    source = out.get("rope_scaling") or out.get("rope_parameters") or {}
    if not isinstance(source, dict) or _nested_by_layer(out, source):
        return out
    both = out.get("rope_scaling"), out.get("rope_parameters")
    if all(both) and _differ(both[0], both[1]):
        return out  # two different spellings: which one a model reads is not known
    if any(
        out.get(key) is not None and key in source and _differ(source[key], out[key])
        for key in ROPE_MOVED[1:]
    ):
        return out  # a top-level value that disagrees with the parameters: both kept
    params = dict(source)
    for key in ROPE_MOVED[1:]:
        if out.get(key) is not None:
            params.setdefault(key, out[key])
    params.setdefault("rope_type", params.get("type", "default"))
    if params.get("type") == params["rope_type"]:
        del params["type"]
    rope_type = params["rope_type"]
    if isinstance(rope_type, str) and rope_type in ROPE_WITH_ORIGINAL_LENGTH:
        if "original_max_position_embeddings" in out:
            # A member, even null, wins (transformers tests it with hasattr); a value that
            # disagrees with P's left the config as it is above.
            params["original_max_position_embeddings"] = out["original_max_position_embeddings"]
        elif out.get("max_position_embeddings") is not None:
            params.setdefault("original_max_position_embeddings", out["max_position_embeddings"])
    for key in ROPE_MOVED:
        out.pop(key, None)
    out["rope_parameters"] = params
    return out


def _differ(a: Any, b: Any) -> bool:
    """Two values differ when their canonical JSON (4) does: ``true`` and ``1`` differ
    (Python's ``==`` takes them for one value), ``1`` and ``1.0`` do not."""
    return canonical_json(a) != canonical_json(b)


def _nested_by_layer(config: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    labels = config.get("layer_types")
    return isinstance(labels, list) and any(key in labels for key in params)


def config_hash(config: Mapping[str, Any]) -> str:
    """The ``config`` hash: SHA-256 of the domain tag and the canonical reduced config."""
    return hashlib.sha256(CONFIG_DOMAIN + canonical_json(drop_config_fields(config))).hexdigest()


def kv_config_hash(config: Mapping[str, Any]) -> str:
    """The ``kv_config`` hash: the reduced config without :data:`KV_CONFIG_DROPPED` too."""
    reduced = drop_config_fields(config, CONFIG_DROPPED | KV_CONFIG_DROPPED)
    return hashlib.sha256(KV_CONFIG_DOMAIN + canonical_json(reduced)).hexdigest()


def adapter_config_hash(config: Mapping[str, Any]) -> str:
    """The ``config`` hash of an adapter, over ``adapter_config.json`` reduced."""
    reduced = {k: v for k, v in config.items() if k not in ADAPTER_CONFIG_DROPPED}
    if reduced.get("peft_type") == "LORA":
        reduced = {
            k: v
            for k, v in reduced.items()
            if not (k in LORA_DEFAULTS and canonical_json(v) == canonical_json(LORA_DEFAULTS[k]))
        }
    for key in ADAPTER_CONFIG_SETS & reduced.keys():
        value = reduced[key]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            reduced[key] = sorted(value, key=lambda v: v.encode())
    for key, value in reduced.items():
        if key.endswith(ADAPTER_ORDERED_SUFFIX) and isinstance(value, dict):
            reduced[key] = [[str(k), v] for k, v in value.items()]  # file order decides
    return hashlib.sha256(ADAPTER_CONFIG_DOMAIN + canonical_json(reduced)).hexdigest()


def tokenizer_view_of_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The members of ``config.json`` that decide the tokenizer (6): at top level and in
    every sub-config (a nested object with ``model_type``), by member name."""
    out: dict[str, Any] = {k: config[k] for k in TOKENIZER_CONFIG_MEMBERS if k in config}
    for key, value in config.items():
        if isinstance(value, dict) and "model_type" in value:
            out[key] = tokenizer_view_of_config(value)
    return out


def small_file_content(path: str | os.PathLike[str], name: str, *, ordered: bool = False) -> bytes:
    """The canonical content of one small file: canonical JSON, else the raw bytes.

    ``ordered`` (the tokenizer id, 6) keeps every object's members in file order:
    transformers collects ``extra_special_tokens`` and the top-level ``*_token`` members of
    ``tokenizer_config.json`` in that order and gives new tokens ids in it.
    """
    if not name.endswith(".json"):
        return read_small(path, name, MAX_SMALL_FILE_SIZE)
    value = read_json(path, name)
    dropped = _LOADER_JSON_DROPS.get(name)
    if dropped is not None and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in dropped}
    try:
        return canonical_json(value, ordered=ordered)
    except NotAModelError as exc:
        raise NotAModelError(f"{name}: {exc.reason}", os.fspath(path)) from exc


def raw_files_hash(
    domain: bytes, files: Iterable[tuple[str, str | os.PathLike[str]]]
) -> str | None:
    """Like :func:`files_hash` with every file's content its raw bytes, streamed (any size)."""
    items = sorted(((name.encode(), src) for name, src in files), key=lambda x: x[0])
    if not items:
        return None
    h = hashlib.sha256(domain)
    h.update(struct.pack("<I", len(items)))
    for encoded, src in items:
        h.update(struct.pack("<I", len(encoded)) + encoded)
        try:
            with open(src, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                h.update(struct.pack("<Q", size))
                left = size
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        raise NotAModelError(f"{encoded.decode()} changed while it was read")
                    h.update(chunk)
                    left -= len(chunk)
        except OSError as exc:
            raise NotAModelError(
                f"cannot read {encoded.decode()}: {exc.strerror or exc}", os.fspath(src)
            ) from exc
    return h.hexdigest()


def chat_template_view(value: Any) -> bytes | None:
    """The ``chat_template`` member of a tokenizer or processor config, canonical, or None."""
    if isinstance(value, dict) and "chat_template" in value:
        return canonical_json({"chat_template": value["chat_template"]})
    return None


#: A small file to hash: ``(repository path, local path)``, or ``(name, content bytes)``.
SmallFile = tuple[str, "str | os.PathLike[str] | bytes"]


def files_hash(domain: bytes, files: Iterable[SmallFile], *, ordered: bool = False) -> str | None:
    """SHA-256 of ``domain``, the file count and each file's name and canonical content
    (JSON objects in file order when ``ordered``: the tokenizer id)."""
    items = sorted(((name.encode(), name, src) for name, src in files), key=lambda x: x[0])
    if not items:
        return None
    h = hashlib.sha256(domain)
    h.update(struct.pack("<I", len(items)))
    for encoded, name, src in items:
        content = src if isinstance(src, bytes) else small_file_content(src, name, ordered=ordered)
        h.update(struct.pack("<I", len(encoded)) + encoded)
        h.update(struct.pack("<Q", len(content)) + content)
    return h.hexdigest()
