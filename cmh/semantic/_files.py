"""Which file of a model directory goes into which id (``spec/semantic.md`` 1.2, v3).

Conservative by default: every file, at any depth, is an input of each kind it may
affect unless it is on the exact, argued inert list of top-level paths (or a weight file
the loader does not read); a file the rules do not understand reaches every group it may
reach, and with code in the directory every file is the code's data. The lists here are
normative and repeated, with the argument for each entry, in the spec.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CONFIG_FILE = "config.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
#: Folders never read as part of a model: version control and local tool state (1).
SKIPPED_DIRS = frozenset({".git", ".cache", ".cmh", ".huggingface", "__pycache__"})

#: The inert files: exact repository paths (top level) that no loader opens to compute an
#: output. Nothing else is inert; with code in the directory not even these (1.2).
INERT_PATHS: tuple[str, ...] = (
    # documentation, licences and repository bookkeeping
    "README.md",
    ".gitattributes",
    ".gitignore",
    "LICENSE",
    "LICENSE.md",
    "LICENSE.txt",
    "NOTICE",
    "NOTICE.md",
    "NOTICE.txt",
    "USE_POLICY.md",
    # Trainer checkpoint state, read only to resume training
    "trainer_state.json",
    "training_args.bin",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
)
#: Kept as a name for callers: the inert list is exact paths now (:data:`INERT_PATHS`).
INERT_PATTERNS: tuple[str, ...] = INERT_PATHS

#: Top-level weight files of the formats a loader reads only when no safetensors set is
#: there, or only when asked by name (1.1 requires a safetensors set). A top-level file of
#: these names that is not in the weight set of 1.1 is read by no stock loader.
UNREAD_WEIGHT_PATTERNS: tuple[str, ...] = (
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "adapter_model.bin",
    "tf_model*.h5",
    "tf_model*.h5.index.json",
    "flax_model*.msgpack",
    "flax_model*.msgpack.index.json",
    "*.gguf",
    "*.onnx",
    "*.onnx_data",
    "consolidated*.pth",
)

#: Top-level files read by ``generate()`` and chat templating only: inputs of ``generation``.
GENERATION_FILES: tuple[str, ...] = (
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)
#: The folder of named chat templates (``additional_chat_templates/{name}.jinja``).
GENERATION_FOLDER = "additional_chat_templates/"

#: Quantization sidecars: runtimes build quantized weights from them (``quant_weight``),
#: and compute K/V and graphs on those weights (``kv``, ``graph``).
QUANT_FILES: tuple[str, ...] = (
    "quantize_config.json",
    "quant_config.json",
    "quantization_config.json",
    "hf_quant_config.json",
)

#: Top-level files read by sentence-transformers only: inputs of ``embedding`` alone.
SENTENCE_TRANSFORMERS_PATTERNS: tuple[str, ...] = (
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "sentence_*_config.json",
)
#: sentence-transformers' module list: its ``path`` members name the module folders.
MODULES_FILE = "modules.json"

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
    """Whether ``path`` (a repository path) is on the exact inert list (1.2)."""
    return path in INERT_PATHS


def is_code(path: str) -> bool:
    return matches_any(_base(path), CODE_PATTERNS)


def is_unread_weight(path: str, weight_files: Iterable[str]) -> bool:
    """A top-level weight file of any format that is not in the weight set of 1.1."""
    return (
        "/" not in path
        and path not in set(weight_files)
        and matches_any(path, UNREAD_WEIGHT_PATTERNS)
    )


@dataclass(frozen=True)
class FileGroups:
    """The repository paths of each group of files (all sorted)."""

    tokenizer: tuple[str, ...]
    processor: tuple[str, ...]
    code: tuple[str, ...]
    embedding: tuple[str, ...]
    generation: tuple[str, ...] = ()
    quant: tuple[str, ...] = ()
    #: With code in the directory: every other file but the weight set (code reads them).
    data: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return sorted(
            {
                *self.tokenizer, *self.processor, *self.code, *self.embedding,
                *self.generation, *self.quant, *self.data,
            }
        )  # fmt: skip


@dataclass(frozen=True)
class GroupingInputs:
    """What :func:`group_files` needs beyond the paths (all optional)."""

    #: The weight files of 1.1: covered by ``weights`` and ``graph``, in no group.
    weight_files: tuple[str, ...] = ()
    #: Paths ``tokenizer_config.json``'s ``fast_tokenizer_files`` names: inputs of the
    #: tokenizer besides the groups their own rule gives them (never instead of those).
    fast_tokenizer_files: tuple[str, ...] = ()
    #: sentence-transformers module folders (``modules.json`` ``path`` members).
    module_dirs: tuple[str, ...] = ()


def group_files(
    paths: Iterable[str],
    *,
    tokenizer_code: bool = False,
    fast_tokenizer_files: Iterable[str] = (),
    inputs: GroupingInputs | None = None,
) -> FileGroups:
    """Sort the repository paths of a model into the groups of the spec (1.2).

    Every path is an input of each kind it may reach unless it is on the exact inert
    list or an unread weight file; a path the rules do not place (an unknown file in a
    subfolder) is an input of the tokenizer, processor and embedding groups. When the
    directory holds code, every non-code path but the weight set is also in ``data``:
    code may open any file of its directory.
    """
    del tokenizer_code  # tokenizer code enters the tokenizer id as the code id (6)
    given = inputs or GroupingInputs()
    extra = {*fast_tokenizer_files, *given.fast_tokenizer_files}
    weights = set(given.weight_files)
    modules = tuple(d.strip("/") + "/" for d in given.module_dirs if d.strip("/"))
    all_paths = sorted(paths)
    has_code = any(is_code(p) for p in all_paths)
    groups: dict[str, list[str]] = {
        k: [] for k in ("tokenizer", "processor", "code", "embedding", "generation", "quant")
    }
    data: list[str] = []
    for path in all_paths:
        if path in weights:
            continue
        if is_code(path):
            groups["code"].append(path)
            continue
        if has_code:
            data.append(path)
        if path in (CONFIG_FILE, ADAPTER_CONFIG_FILE) or is_inert(path):
            continue
        if is_unread_weight(path, weights):
            continue
        for group in _groups_of(path, modules, extra):
            groups[group].append(path)
    return FileGroups(**{k: tuple(v) for k, v in groups.items()}, data=tuple(data))


def _groups_of(path: str, modules: tuple[str, ...], fast_tokenizer: set[str]) -> tuple[str, ...]:
    """The groups of a non-code, non-inert path (1.2): the first rule's, plus ``generation``
    for a generation file, ``embedding`` under a module folder and ``tokenizer`` for a name
    ``fast_tokenizer_files`` lists, whichever rule came first (the loaders read the file
    for each of these reasons). Being listed there only adds ``tokenizer``: a processor
    still reads ``preprocessor_config.json`` by its name whatever the tokenizer's config
    lists, so a listed file keeps the groups of its own rule."""
    generation = path in GENERATION_FILES or path.startswith(GENERATION_FOLDER)
    module = "/" in path and path.startswith(modules)
    first: tuple[str, ...]
    if generation:
        first = ("generation",)
    elif module:
        first = ("embedding",)  # a sentence-transformers module folder
    elif "/" in path:
        first = ("tokenizer", "processor", "embedding")  # not understood: all it may reach
    elif matches_any(path, SENTENCE_TRANSFORMERS_PATTERNS):
        first = ("embedding",)
    elif path in QUANT_FILES:
        first = ("processor", "quant")
    elif matches_any(path, TOKENIZER_ONLY_PATTERNS):
        first = ("tokenizer",)
    else:
        first = ("tokenizer", "processor")
    added = {
        "generation": generation,
        "embedding": module,
        "tokenizer": path in fast_tokenizer,
    }
    return (*first, *(group for group, yes in added.items() if yes and group not in first))


# -- code references ----------------------------------------------------------------------

#: Auto classes whose code runs to tokenize (reasons under ``tokenizer``).
TOKENIZER_AUTO_CLASSES: frozenset[str] = frozenset({"AutoTokenizer", "AutoProcessor"})
#: Auto classes whose code runs to prepare the model's inputs (reasons under ``processor``).
PROCESSOR_AUTO_CLASSES: frozenset[str] = frozenset(
    {"AutoProcessor", "AutoImageProcessor", "AutoFeatureExtractor", "AutoVideoProcessor"}
)
#: Configuration files whose list-form ``auto_map`` names a tokenizer (transformers'
#: legacy form) or a processor.
_LIST_FORM_CLASS: dict[str, str] = {TOKENIZER_CONFIG_FILE: "AutoTokenizer"}
#: The module type prefix of sentence-transformers' own modules (installed code).
ST_LIBRARY_PREFIX = "sentence_transformers."


def is_config_file(path: str) -> bool:
    """Top-level JSON files scanned for code references: ``config.json`` and every
    ``*config*.json`` (tokenizer, processor, image-, video-processor, feature extractor)."""
    return "/" not in path and path.endswith(".json") and "config" in path


@dataclass(frozen=True)
class CodeReferences:
    """What the code references of a directory need: which code runs where, what is missing."""

    tokenizer_code: bool
    #: Reasons no key can cover the model's code (another repo's code, a missing module).
    missing_model_code: tuple[str, ...]
    #: The same for the tokenizer's code.
    missing_tokenizer_code: tuple[str, ...]
    #: The same for the processor's code (image, video, audio processors, processors).
    missing_processor_code: tuple[str, ...] = ()
    #: The same for sentence-transformers modules (``modules.json`` types).
    missing_embedding_code: tuple[str, ...] = ()


def auto_map_references(
    sources: Iterable[tuple[str, Any]], present: Iterable[str]
) -> CodeReferences:
    """Read the ``auto_map`` of each ``(file name, parsed JSON)``, and the module types of
    ``modules.json`` (a source named so).

    ``auto_map`` is an object of auto class to a reference or a list of references, or
    (legacy) a list of references of the file's own class. A reference ``module.Class``
    needs ``module`` (dots are folders) as a ``.py`` file of the directory;
    ``repo--module.Class`` names another repository's code. Either kind of unavailable
    code is a reason, never a key computed without it.
    """
    have = set(present)
    tokenizer_code = False
    missing: dict[str, list[str]] = {"model": [], "tokenizer": [], "processor": [], "embedding": []}
    for file_name, obj in sources:
        if file_name == MODULES_FILE:
            missing["embedding"].extend(_module_types(obj, have))
            continue
        for auto_class, ref in _auto_map_entries(file_name, obj):
            groups = _reason_groups(file_name, auto_class)
            if "tokenizer" in groups:
                tokenizer_code = True
            reason = _unavailable(f"{file_name} auto_map {auto_class}", ref, have)
            if reason is not None:
                for group in groups:
                    missing[group].append(reason)
    return CodeReferences(
        tokenizer_code,
        *(tuple(sorted(set(missing[k]))) for k in ("model", "tokenizer", "processor", "embedding")),
    )


def _auto_map_entries(file_name: str, obj: Any) -> list[tuple[str, object]]:
    auto_map = obj.get("auto_map") if isinstance(obj, dict) else None
    if auto_map is None:
        return []
    if not isinstance(auto_map, dict):  # the legacy list form (anything else: a reason)
        default = _LIST_FORM_CLASS.get(file_name, "AutoProcessor" if file_name != CONFIG_FILE
                                       else "AutoModel")  # fmt: skip
        return [(default, ref) for ref in _references(auto_map)]
    out: list[tuple[str, object]] = []
    for auto_class, value in auto_map.items():
        for ref in _references(value):
            out.append((str(auto_class), ref))
    return out


def _references(value: object) -> list[object]:
    """The references of one ``auto_map`` value: a reference, a list of them (slow, fast),
    or an object of them by backend (image processors: ``{"torchvision": ..., "pil": ...}``);
    ``null`` entries skipped."""
    if isinstance(value, list):
        return [ref for item in value for ref in _references(item)]
    if isinstance(value, dict):
        return [ref for item in value.values() for ref in _references(item)]
    return [] if value is None else [value]


def _reason_groups(file_name: str, auto_class: str) -> tuple[str, ...]:
    groups: list[str] = []
    if auto_class in TOKENIZER_AUTO_CLASSES:
        groups.append("tokenizer")
    if auto_class in PROCESSOR_AUTO_CLASSES or (
        auto_class not in TOKENIZER_AUTO_CLASSES
        and ("Processor" in auto_class or "FeatureExtractor" in auto_class)
    ):
        groups.append("processor")
    return tuple(groups) or ("model",)


def _module_types(obj: Any, have: set[str]) -> list[str]:
    """Reasons for sentence-transformers module types whose code the directory lacks."""
    reasons: list[str] = []
    for i, entry in enumerate(obj if isinstance(obj, list) else []):
        ref = entry.get("type") if isinstance(entry, dict) else None
        if isinstance(ref, str) and ref.startswith(ST_LIBRARY_PREFIX):
            continue  # the installed library's own module
        reason = _unavailable(f"{MODULES_FILE} module {i} type", ref, have)
        if reason is not None:
            reasons.append(reason)
    return reasons


def _module_paths(obj: Any) -> list[tuple[int, str]]:
    return [
        (i, entry["path"])
        for i, entry in enumerate(obj if isinstance(obj, list) else [])
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and entry["path"]
    ]


def module_dirs(obj: Any) -> tuple[str, ...]:
    """The non-empty ``path`` members of ``modules.json`` (module folders), normalized
    (``./1_Pooling`` is ``1_Pooling``)."""
    return tuple(sorted({posixpath.normpath(path) for _, path in _module_paths(obj)}))


def fast_tokenizer_files(tokenizer_config: Any) -> list[str]:
    """The paths ``tokenizer_config.json``'s ``fast_tokenizer_files`` lists (a tokenizer
    loads one instead of ``tokenizer.json``), normalized (``./a.json`` is ``a.json``)."""
    listed = _listed(tokenizer_config, "fast_tokenizer_files")
    return [posixpath.normpath(name) for name in listed if isinstance(name, str) and name]


def _listed(obj: Any, member: str) -> list[Any]:
    """``obj[member]`` when ``obj`` is an object whose ``member`` is a list, else ``[]``."""
    value = obj.get(member) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def outside_reason(where: str, path: str, *, folder: bool) -> str | None:
    """Why a path a loader joins to the directory names no file this reader hashes, or None.

    A loader opens ``directory/path``: an absolute path or one leaving the directory
    (``..``) names another file, and one in a folder that is never read (1: ``.cache/``,
    ``.git/``, ...) names a file no id covers. ``folder``: the path is a folder (every
    component counts), not a file (its folders count).
    """
    if path.startswith("/"):
        return f"{where}: {path!r} is an absolute path, outside the directory"
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../"):
        return f"{where}: {path!r} leaves the directory"
    parts = normal.split("/") if folder else normal.split("/")[:-1]
    skipped = sorted(set(parts) & SKIPPED_DIRS)
    if skipped:
        return f"{where}: {path!r} lies in {skipped[0]}/, a folder that is never read"
    return None


def referenced_path_reasons(
    tokenizer_config: Any, special_tokens_map: Any, modules: Any
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Reasons (``tokenizer``, ``embedding``) for files the loaders open that no id covers.

    - a ``fast_tokenizer_files`` entry outside the directory or in a skipped folder
      (transformers builds the tokenizer from it);
    - a ``tokenizer_file`` member of ``special_tokens_map.json`` that is not ``null``:
      transformers copies every member of that file into the tokenizer's arguments (when
      ``tokenizer_config.json`` has no ``added_tokens_decoder``) and builds the tokenizer
      from the file it names, by that path (absolute, or relative to the working
      directory), not from the directory;
    - a ``modules.json`` module ``path`` outside the directory or in a skipped folder
      (sentence-transformers loads the module from it).
    """
    tokenizer: list[str] = []
    for path in _listed(tokenizer_config, "fast_tokenizer_files"):
        if isinstance(path, str) and path:
            reason = outside_reason(
                f"{TOKENIZER_CONFIG_FILE} fast_tokenizer_files", path, folder=False
            )
            if reason is not None:
                tokenizer.append(reason)
    named = special_tokens_map.get("tokenizer_file") if isinstance(
        special_tokens_map, dict) else None  # fmt: skip
    if named is not None:
        tokenizer.append(
            f"{SPECIAL_TOKENS_MAP_FILE} tokenizer_file: {named!r} is opened by that path "
            "(absolute, or relative to the working directory), not from the directory"
        )
    embedding = [
        reason
        for i, path in _module_paths(modules)
        if (reason := outside_reason(f"{MODULES_FILE} module {i} path", path, folder=True))
    ]
    return tuple(sorted(set(tokenizer))), tuple(sorted(set(embedding)))


def _unavailable(where: str, ref: object, have: set[str]) -> str | None:
    if not isinstance(ref, str) or "." not in ref:
        return f"{where}: {ref!r} is not a module.Class reference"
    if "--" in ref:
        return f"{where}: {ref!r} is code of another repository"
    module = ref.rsplit(".", 1)[0]
    path = module.replace(".", "/") + ".py"
    if path not in have:
        return f"{where}: {ref!r} needs {path}, which the directory lacks"
    return None
