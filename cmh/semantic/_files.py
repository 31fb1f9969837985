"""Which file of a model directory goes into which id (``spec/semantic.md`` 1.2, v3).

Conservative by default: every file is an input of each kind it may affect
unless it is on a short, argued inert list. The lists here are normative and
repeated, with the argument for each entry, in the spec.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CONFIG_FILE = "config.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

#: Files no loader reads to compute an output (any folder; matched against the base name).
INERT_PATTERNS: tuple[str, ...] = (
    # documentation, licences and repository bookkeeping: never opened by a loader
    "*.md",
    "LICENSE*",
    "NOTICE*",
    "USE_POLICY*",
    ".gitattributes",
    ".gitignore",
    # images shown on model cards
    "*.png",
    "*.jpg",
    "*.jpeg",
    "*.gif",
    "*.svg",
    "*.webp",
    # weights: the safetensors set a loader reads is `weights` (1.1); other safetensors
    # files and other weight formats are not read when that set exists
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "tf_model*.h5",
    "tf_model*.h5.index.json",
    "flax_model*.msgpack",
    "flax_model*.msgpack.index.json",
    "*.gguf",
    "*.onnx",
    "*.onnx_data",
    "consolidated*.pth",
    # trainer state: written by Trainer checkpoints, read only to resume training
    "training_args.bin",
    "trainer_state.json",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state*.pth",
    # the decoding loop's settings and the chat template (messages -> text): neither is
    # read by a forward pass, nor by a tokenizer turning a text into ids
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)

#: Top-level files read by sentence-transformers only: inputs of ``embedding`` alone.
SENTENCE_TRANSFORMERS_PATTERNS: tuple[str, ...] = (
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "sentence_*_config.json",
)

#: Top-level names known to be read by a tokenizer and by nothing else: the only files
#: that may be left out of ``kv`` (K/V for given token ids do not depend on them). A name
#: not matched here is an input of ``kv`` too, which can only split keys.
TOKENIZER_ONLY_PATTERNS: tuple[str, ...] = (
    "added_tokens.json",
    "bpe.codes",
    "byte_maps.json",
    "dict.txt",
    "emoji.json",
    "entity_vocab.json",
    "merges*.txt",
    "normalizer.json",
    "prophetnet.tokenizer",
    "*.model",
    "*.model.v*",
    "*.spm",
    "*.tiktoken",
    "tiktoken.model",
    "tekken.json",
    "special_tokens_map.json",
    "target_vocab.json",
    "tokenizer*.json",
    "vocab*.json",
    "vocab*.txt",
    "word_pronunciation.json",
    "word_shape.json",
)

#: Code: Python modules in any folder (``trust_remote_code`` imports them, and a module
#: may import any other one).
CODE_PATTERNS: tuple[str, ...] = ("*.py",)


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """True when ``name`` matches one of the shell ``patterns`` (case-sensitive)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def is_inert(path: str) -> bool:
    """Whether no loader reads ``path`` (a repository path) to compute an output."""
    return matches_any(_base(path), INERT_PATTERNS)


def is_code(path: str) -> bool:
    return matches_any(_base(path), CODE_PATTERNS)


@dataclass(frozen=True)
class FileGroups:
    """The repository paths of each group of small files (all sorted)."""

    tokenizer: tuple[str, ...]
    processor: tuple[str, ...]
    code: tuple[str, ...]
    embedding: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return sorted({*self.tokenizer, *self.processor, *self.code, *self.embedding})


def group_files(
    paths: Iterable[str], *, tokenizer_code: bool, tokenizer_only: Iterable[str] = ()
) -> FileGroups:
    """Sort the repository paths of a model into the groups of the spec (1.2).

    ``tokenizer_code``: an ``auto_map`` names a tokenizer class, so transformers
    imports the directory's code to tokenize (then every code file is a tokenizer
    input too). ``tokenizer_only``: further top-level names that only a tokenizer
    reads (those of ``fast_tokenizer_files``).
    """
    extra = set(tokenizer_only)
    tokenizer: list[str] = []
    processor: list[str] = []
    code: list[str] = []
    embedding: list[str] = []
    for path in sorted(paths):
        if path in (CONFIG_FILE, ADAPTER_CONFIG_FILE) or is_inert(path):
            continue
        if is_code(path):
            code.append(path)
            if tokenizer_code:
                tokenizer.append(path)
            continue
        if "/" in path or matches_any(path, SENTENCE_TRANSFORMERS_PATTERNS):
            embedding.append(path)  # sentence-transformers modules and configs
            continue
        tokenizer.append(path)
        if not (path in extra or matches_any(path, TOKENIZER_ONLY_PATTERNS)):
            processor.append(path)
    return FileGroups(tuple(tokenizer), tuple(processor), tuple(code), tuple(embedding))


# -- auto_map ----------------------------------------------------------------------------

#: ``auto_map`` entries that make the tokenizer run the directory's code.
TOKENIZER_AUTO_CLASSES: frozenset[str] = frozenset({"AutoTokenizer"})


@dataclass(frozen=True)
class CodeReferences:
    """What ``auto_map`` entries need: whether the tokenizer runs code, what is missing."""

    tokenizer_code: bool
    #: Reasons no key can cover the model's code (another repo's code, a missing module).
    missing_model_code: tuple[str, ...]
    #: The same for the tokenizer's code.
    missing_tokenizer_code: tuple[str, ...]


def auto_map_references(
    sources: Iterable[tuple[str, Mapping[str, Any] | None]], present: Iterable[str]
) -> CodeReferences:
    """Read the ``auto_map`` of each ``(file name, parsed JSON object)``.

    A reference ``module.Class`` needs ``module`` (dots are folders) as a ``.py`` file of
    the directory; ``repo--module.Class`` names another repository's code. Either
    kind of unavailable code is a reason, never a key computed without it.
    """
    have = set(present)
    tokenizer_code = False
    model_missing: list[str] = []
    tokenizer_missing: list[str] = []
    for file_name, obj in sources:
        auto_map = (obj or {}).get("auto_map")
        if not isinstance(auto_map, dict):
            continue
        for auto_class, value in auto_map.items():
            refs = value if isinstance(value, list) else [value]
            is_tokenizer = auto_class in TOKENIZER_AUTO_CLASSES
            for ref in refs:
                if ref is None:
                    continue
                if is_tokenizer:
                    tokenizer_code = True
                reason = _unavailable(file_name, str(auto_class), ref, have)
                if reason is not None:
                    (tokenizer_missing if is_tokenizer else model_missing).append(reason)
    return CodeReferences(
        tokenizer_code, tuple(sorted(set(model_missing))), tuple(sorted(set(tokenizer_missing)))
    )


def _unavailable(file_name: str, auto_class: str, ref: object, have: set[str]) -> str | None:
    where = f"{file_name} auto_map {auto_class}"
    if not isinstance(ref, str) or "." not in ref:
        return f"{where}: {ref!r} is not a module.Class reference"
    if "--" in ref:
        return f"{where}: {ref!r} is code of another repository"
    module = ref.rsplit(".", 1)[0]
    path = module.replace(".", "/") + ".py"
    if path not in have:
        return f"{where}: {ref!r} needs {path}, which the directory lacks"
    return None
