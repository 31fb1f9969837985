"""``ModelFingerprint``: content-derived ids of a model, cache keys and compatibility.

A cache key is ``scope/type/id``: ``type`` is the cache kind, ``id`` hashes
everything the entries depend on, and ``scope`` names what the entries belong
to: the (base) model's weights for kinds that depend on weights, the content
itself for kinds shared across models (``tokenizer``, ``graph``). Two
fingerprints' keys for a kind are equal exactly when their ids are; the rule
table is in ``spec/semantic.md``.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ._errors import CacheKindError, FingerprintFormatError, SemanticError

FORMAT = "cmh-semantic-v3"
KEY_DOMAIN = b"CMH-SEM-KEY-v3\n"
SCOPE_HEX = 16

#: Cache kinds a runtime can ask keys for (the ``type`` part of a key).
CACHE_KINDS: tuple[str, ...] = (
    "weights",
    "lora",
    "kv",
    "kv_text",
    "tokenizer",
    "graph",
    "quant_weight",
    "embedding",
    "generation",
)
#: Kinds whose entries are shared across models: their scope is their own id's prefix.
SHARED_KINDS: frozenset[str] = frozenset({"tokenizer", "graph"})

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_OPTIONAL_IDS = (
    "tokenizer", "config", "kv_config", "processor", "code", "embedding", "generation",
    "quant_config",
)  # fmt: skip
#: Per group of ``missing_code`` reasons: the kinds that have no key (1.2).
_CODE_KINDS: dict[str, frozenset[str]] = {
    "model": frozenset({"kv", "kv_text", "graph", "quant_weight", "embedding", "generation"}),
    "processor": frozenset({"kv", "kv_text", "graph", "embedding", "generation"}),
    "tokenizer": frozenset({"tokenizer", "kv_text", "embedding", "generation"}),
    "embedding": frozenset({"embedding"}),
}


def key_id(kind: str, *fields: str) -> str:
    """SHA-256 (hex) of the key domain, the kind and length-prefixed UTF-8 fields."""
    h = hashlib.sha256(KEY_DOMAIN)
    for item in (kind, *fields):
        data = item.encode()
        h.update(struct.pack("<I", len(data)) + data)
    return h.hexdigest()


@dataclass(frozen=True)
class ModelFingerprint:
    """Content-derived identity of a model or adapter directory.

    ``graph``, ``weights`` and the optional ids (``tokenizer``, ``config``,
    ``kv_config``, ``processor``, ``code``; ``None`` when their files are
    absent) are 64 lowercase hex characters (SHA-256). An adapter has
    ``adapter_type`` (e.g. ``"LORA"``), the ``base_model`` name it was trained
    on, and ``base``: the base model's fingerprint when the caller supplied it
    (needed for every key but ``weights`` and ``lora``). ``files`` (inputs
    read), ``hashed_files`` (weight files hashed) and ``untrusted_stamps``
    (stamped files hashed anyway, with the reason) say how it was read and are
    left out of equality: a stamped and an unstamped copy compare equal.
    """

    arch: str | None
    family: str | None
    task: str | None
    graph: str
    weights: str
    tokenizer: str | None
    config: str | None
    kv_config: str | None = None
    processor: str | None = None
    code: str | None = None
    embedding: str | None = None
    #: ``generate()`` settings and chat templates (``generation`` kind).
    generation: str | None = None
    #: Quantization sidecars (``quantize_config.json``, ...): part of ``quant_weight``.
    quant_config: str | None = None
    #: Why no key can cover the model's code (``auto_map`` naming another repository's
    #: code, or a module the directory lacks): kinds depending on it have no key.
    missing_code: tuple[str, ...] = ()
    #: The same for the tokenizer's code (``auto_map`` ``AutoTokenizer``).
    missing_tokenizer_code: tuple[str, ...] = ()
    #: The same for processor code (``auto_map`` of a processor or its config).
    missing_processor_code: tuple[str, ...] = ()
    #: The same for sentence-transformers modules (``modules.json`` types).
    missing_embedding_code: tuple[str, ...] = ()
    adapter_type: str | None = None
    base_model: str | None = None
    base: ModelFingerprint | None = None
    tensor_count: int = 0
    tensor_bytes: int = 0
    files: tuple[str, ...] = field(default=(), compare=False)
    hashed_files: tuple[str, ...] = field(default=(), compare=False)
    untrusted_stamps: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    scope: str = field(init=False)

    def __post_init__(self) -> None:
        for name in ("graph", "weights"):
            _check_hex(name, getattr(self, name))
        for name in _OPTIONAL_IDS:
            value = getattr(self, name)
            if value is not None:
                _check_hex(name, value)
        if self.base is not None:
            if self.adapter_type is None:
                raise FingerprintFormatError("only an adapter fingerprint has a base")
            if self.base.adapter_type is not None:
                raise FingerprintFormatError("the base of an adapter must be a full model")
        object.__setattr__(self, "scope", self.weights[:SCOPE_HEX])

    @property
    def is_adapter(self) -> bool:
        return self.adapter_type is not None

    @property
    def effective_tokenizer(self) -> str | None:
        """The id of the tokenizer in use (the ``tokenizer`` key's id), or ``None``.

        A model's own. For an adapter applied to a base: the base's when the
        adapter has no tokenizer files, else both combined (an adapter may ship
        only part of a tokenizer, e.g. ``tokenizer_config.json``, and the rest
        comes from the base). ``None`` for an adapter without its base.
        """
        return self._effective("tokenizer")

    def _effective(self, name: str) -> str | None:
        """``tokenizer``, ``processor`` or ``code`` in use: see :attr:`effective_tokenizer`."""
        own: str | None = getattr(self, name)
        if not self.is_adapter:
            return own
        if self.base is None:
            return None
        inherited: str | None = getattr(self.base, name)
        if own is None:
            return inherited
        return key_id(name, inherited or "", own)

    def with_base(self, base: ModelFingerprint) -> ModelFingerprint:
        """This adapter applied to ``base``: keys then cover the base model too."""
        if not self.is_adapter:
            raise SemanticError("with_base applies to adapter fingerprints only")
        if base.is_adapter:
            raise SemanticError("the base must be a full model, not an adapter")
        return replace(self, base=base, arch=base.arch, family=base.family)

    # -- keys ------------------------------------------------------------------------

    def component(self, kind: str, *, variant: str = "") -> str:
        """The ``id`` part of the key for ``kind`` (see :meth:`cache_key`)."""
        _check_request(kind, variant)
        self._check_code(kind)
        if kind == "weights":
            return self.weights
        if kind == "lora":
            if not self.is_adapter:
                raise CacheKindError("lora keys exist for adapters only")
            return key_id("lora", self.weights, self.config or "")
        model = self._model_for(kind)
        if kind == "tokenizer":
            tokenizer = self.effective_tokenizer
            if tokenizer is None:
                raise CacheKindError("no tokenizer files: no tokenizer key")
            return tokenizer
        if kind == "kv_text":
            return key_id("kv_text", self.component("kv"), self.component("tokenizer"))
        if kind == "embedding":
            return key_id(
                "embedding", self.component("kv_text"), self._effective("embedding") or ""
            )
        if kind == "generation":
            return key_id(
                "generation", self.component("kv_text"), self._effective("generation") or ""
            )
        if kind == "quant_weight":
            return key_id(
                "quant_weight",
                model.weights,
                model.config or "",
                model.code or "",
                model.quant_config or "",
                variant,
            )
        processor = self._effective("processor") or ""
        code = self._effective("code") or ""
        adapter = self if self.is_adapter else None
        if kind == "kv":
            return key_id(
                "kv",
                model.weights,
                model.kv_config or "",
                processor,
                code,
                adapter.component("lora") if adapter is not None else "",
            )
        return key_id(
            "graph",
            model.arch or "",
            model.family or "",
            model.graph,
            model.config or "",
            processor,
            code,
            adapter.graph if adapter is not None else "",
            adapter.config or "" if adapter is not None else "",
        )

    def _check_code(self, kind: str) -> None:
        """Refuse a key for ``kind`` when code it depends on is not in the directory."""
        sources = [self, *([self.base] if self.base is not None else [])]
        for fp in sources:
            for group, reasons in fp.missing_groups().items():
                if kind in _CODE_KINDS[group] and reasons:
                    raise CacheKindError(f"no {kind} key: {reasons[0]}")

    def missing_groups(self) -> dict[str, tuple[str, ...]]:
        """The ``missing_code`` reasons by group (``model``, ``processor``, ``tokenizer``,
        ``embedding``)."""
        return {
            "model": self.missing_code,
            "processor": self.missing_processor_code,
            "tokenizer": self.missing_tokenizer_code,
            "embedding": self.missing_embedding_code,
        }

    def _model_for(self, kind: str) -> ModelFingerprint:
        """The full model whose files a ``kind`` key covers: self, or an adapter's base."""
        if not self.is_adapter:
            return self
        if self.base is None:
            raise CacheKindError(
                f"a {kind} key of an adapter needs its base model's fingerprint "
                "(fingerprint(adapter, base=...) or with_base)"
            )
        return self.base

    def key_scope(self, kind: str, *, variant: str = "") -> str:
        """The ``scope`` part of the key for ``kind``.

        ``weights``, ``lora``: this directory's weights (:attr:`scope`);
        ``kv``, ``kv_text``, ``quant_weight``: the weights of the full model
        (an adapter's base), so evicting a base model by its scope removes the
        entries of every adapter over it; ``tokenizer``, ``graph`` (shared by
        every model with equal ids): the first 16 hex characters of the id.
        """
        return self._scope(kind, self.component(kind, variant=variant))

    def _scope(self, kind: str, identity: str) -> str:
        if kind in SHARED_KINDS:
            return identity[:SCOPE_HEX]
        if kind in ("weights", "lora"):
            return self.scope
        return self._model_for(kind).scope

    def cache_key(self, kind: str, *, variant: str = "") -> str:
        """The ``scope/type/id`` key a runtime should use for a cache of ``kind``.

        ``kind`` is one of :data:`CACHE_KINDS`. ``variant`` names the runtime's
        quantization scheme for ``quant_weight`` (e.g. ``"int8"``). Two
        fingerprints' keys are equal exactly when :meth:`compatible` is true.
        Raises :class:`CacheKindError` when the kind does not apply (``lora``
        of a full model, ``tokenizer``/``kv_text`` without tokenizer files,
        any kind but ``weights``/``lora`` of an adapter without its base).
        """
        identity = self.component(kind, variant=variant)
        return f"{self._scope(kind, identity)}/{kind}/{identity}"

    def compatible(self, other: ModelFingerprint, kind: str, *, variant: str = "") -> bool:
        """Whether cache entries of ``kind`` made under one can serve the other.

        True exactly when both have a key id for ``kind`` and the ids are equal.
        """
        _check_request(kind, variant)
        try:
            return self.component(kind, variant=variant) == other.component(kind, variant=variant)
        except CacheKindError:
            return False

    def keys(self) -> dict[str, str | None]:
        """The key of every cache kind (``None`` where the kind does not apply)."""
        out: dict[str, str | None] = {}
        for kind in CACHE_KINDS:
            try:
                out[kind] = self.cache_key(kind)
            except CacheKindError:
                out[kind] = None
        return out

    # -- JSON ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field, plus ``format`` and the ``keys`` of every kind."""
        return {
            "format": FORMAT,
            "scope": self.scope,
            "arch": self.arch,
            "family": self.family,
            "task": self.task,
            "graph": self.graph,
            "weights": self.weights,
            "tokenizer": self.tokenizer,
            "config": self.config,
            "kv_config": self.kv_config,
            "processor": self.processor,
            "code": self.code,
            "embedding": self.embedding,
            "generation": self.generation,
            "quant_config": self.quant_config,
            "missing_code": {k: list(v) for k, v in self.missing_groups().items()},
            "adapter_type": self.adapter_type,
            "base_model": self.base_model,
            "base": self.base.to_dict() if self.base is not None else None,
            "tensor_count": self.tensor_count,
            "tensor_bytes": self.tensor_bytes,
            "files": list(self.files),
            "hashed_files": list(self.hashed_files),
            "untrusted_stamps": dict(self.untrusted_stamps),
            "keys": self.keys(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelFingerprint:
        """Rebuild a fingerprint from :meth:`to_dict` output; its derived parts are checked."""
        if not isinstance(data, Mapping):
            raise FingerprintFormatError("a fingerprint must be a JSON object")
        if data.get("format") != FORMAT:
            raise FingerprintFormatError(
                f"format is {data.get('format')!r}, this library reads {FORMAT!r}"
            )
        base_data = data.get("base")
        fp = cls(
            arch=_opt_str(data, "arch"),
            family=_opt_str(data, "family"),
            task=_opt_str(data, "task"),
            graph=_str(data, "graph"),
            weights=_str(data, "weights"),
            tokenizer=_opt_str(data, "tokenizer"),
            config=_opt_str(data, "config"),
            kv_config=_opt_str(data, "kv_config"),
            processor=_opt_str(data, "processor"),
            code=_opt_str(data, "code"),
            embedding=_opt_str(data, "embedding"),
            generation=_opt_str(data, "generation"),
            quant_config=_opt_str(data, "quant_config"),
            missing_code=_missing(data, "model"),
            missing_tokenizer_code=_missing(data, "tokenizer"),
            missing_processor_code=_missing(data, "processor"),
            missing_embedding_code=_missing(data, "embedding"),
            adapter_type=_opt_str(data, "adapter_type"),
            base_model=_opt_str(data, "base_model"),
            base=cls.from_dict(base_data) if base_data is not None else None,
            tensor_count=_count(data, "tensor_count"),
            tensor_bytes=_count(data, "tensor_bytes"),
            files=_names(data, "files"),
            hashed_files=_names(data, "hashed_files"),
            untrusted_stamps=_reasons(data, "untrusted_stamps"),
        )
        if "scope" in data and data["scope"] != fp.scope:
            raise FingerprintFormatError("scope does not match weights")
        if "keys" in data and data["keys"] != fp.keys():
            raise FingerprintFormatError("keys do not match the fingerprint's components")
        return fp


def _check_request(kind: str, variant: str) -> None:
    if kind not in CACHE_KINDS:
        raise CacheKindError(f"unknown cache kind {kind!r}; one of {', '.join(CACHE_KINDS)}")
    if variant and kind != "quant_weight":
        raise CacheKindError("a variant applies to quant_weight keys only")


def _check_hex(name: str, value: object) -> None:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise FingerprintFormatError(f"{name} must be 64 lowercase hex characters, got {value!r}")


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise FingerprintFormatError(f"{key} must be a string")
    return value


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise FingerprintFormatError(f"{key} must be a string or null")
    return value


def _count(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FingerprintFormatError(f"{key} must be a non-negative integer")
    return value


def _names(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FingerprintFormatError(f"{key} must be a list of strings")
    return tuple(value)


def _reasons(data: Mapping[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise FingerprintFormatError(f"{key} must be an object of file name to reason")
    return tuple(value.items())


def _missing(data: Mapping[str, Any], group: str) -> tuple[str, ...]:
    value = data.get("missing_code", {})
    if not isinstance(value, dict):
        raise FingerprintFormatError("missing_code must be an object")
    reasons = value.get(group, [])
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise FingerprintFormatError(f"missing_code.{group} must be a list of strings")
    return tuple(reasons)
