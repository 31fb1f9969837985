"""Issue 38's oracle: "conservative by construction", checked against the stock loaders.

Each model is loaded as a runtime loads it (transformers' auto classes, the tokenizer,
the feature extractor, sentence-transformers, PEFT, remote code) while an audit hook
records every file opened and a recording config every config member read. Each file a
loader opened must be an input of the kinds spec/semantic.md says depend on that loader's
output, and each ``config.json`` member the tokenizer loader read must be in the tokenizer
view. The test prints what each loader read (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_semantic_cache_keys import _tiny_llama, _word_tokenizer, copy_model
from test_semantic_v4 import _data_model, st_dense  # noqa: F401 (a fixture)

from cmh.semantic import CONFIG_DROPPED, fingerprint
from cmh.semantic._canonical import TOKENIZER_CONFIG_MEMBERS
from cmh.semantic._files import GroupingInputs, group_files

pytestmark = pytest.mark.heavy

_SMALL: dict[str, Any] = dict(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, head_dim=8,
    n_embd=16, n_layer=1, n_head=2, n_positions=64, d_model=16, d_ff=32, num_layers=1,
    num_heads=2, d_kv=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
    decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, image_size=16,
    patch_size=4, num_channels=3, embed_dim=16,
)  # fmt: skip
TEXT_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "gpt2", "gpt_neox",
    "qwen3_moe", "opt", "bloom", "starcoder2", "olmo", "olmo2", "stablelm", "granite", "cohere",
    "persimmon", "mixtral", "qwen2_moe", "bert", "roberta", "distilbert", "electra",
    "albert", "deberta-v2", "t5", "bart", "mbart",
)  # fmt: skip
VISION_TYPES = ("vit", "deit", "beit", "dinov2")
AUDIO_TYPES = ("wav2vec2", "hubert")
MULTIMODAL_TYPES = ("clip", "siglip", "blip")
_TEXT_CONFIG = dict(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, max_position_embeddings=64,
)  # fmt: skip
_VISION_CONFIG = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    image_size=16, patch_size=4, num_channels=3,
)  # fmt: skip
#: Inert config members a forward pass may read, and why the value still does not change:
#: switches of what is returned, dropout (identity in eval mode), initialization of
#: weights the checkpoint provides, labels whose count is the head's shape (graph).
READ_BUT_INERT = frozenset(CONFIG_DROPPED) - {"_commit_hash", "transformers_version"}


@dataclass
class Reads:
    """Files opened below a directory and config members read, while recording."""

    root: str
    files: set[str] = field(default_factory=set)
    members: set[str] = field(default_factory=set)


_ACTIVE: list[Reads] = []
#: Config reads by the config classes themselves (validators, properties, ``to_dict``) are
#: not a consumer's reads: the oracle records reads from everywhere else.
_CONFIG_INTERNALS = (
    "configuration_utils.py", "modeling_rope_utils.py", f"huggingface_hub{os.sep}dataclasses.py"
)  # fmt: skip
#: Inert files a stock loader opens, each with why no output depends on it.
OPENED_BUT_INERT = {
    "README.md": "sentence-transformers keeps the model card text for save(); encode() "
    "never reads it",
}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _ACTIVE or not isinstance(args[0], str | bytes | os.PathLike):
        return
    path = os.path.realpath(os.fsdecode(args[0]))
    for reads in _ACTIVE:
        if path.startswith(reads.root + os.sep):
            reads.files.add(os.path.relpath(path, reads.root).replace(os.sep, "/"))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only while active


@contextlib.contextmanager
def recording(directory: Path) -> Iterator[Reads]:
    """Record the files opened below ``directory`` and every config member read."""
    from transformers import PreTrainedConfig

    reads = Reads(os.path.realpath(directory))
    original = PreTrainedConfig.__getattribute__

    def getattribute(self: Any, key: str) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        internal = caller.endswith(_CONFIG_INTERNALS) or os.path.basename(caller).startswith(
            "configuration_"
        )
        if not internal:  # a consumer: modeling, tokenizer code
            reads.members.add(key)
        return original(self, key)

    _ACTIVE.append(reads)
    PreTrainedConfig.__getattribute__ = getattribute  # type: ignore[method-assign]
    try:
        with _rust_opens():
            yield reads
    finally:
        PreTrainedConfig.__getattribute__ = original  # type: ignore[method-assign]
        _ACTIVE.remove(reads)


@contextlib.contextmanager
def _rust_opens() -> Iterator[None]:
    """Files opened by Rust code raise no audit event: ``safetensors.safe_open`` and
    ``tokenizers.Tokenizer.from_file`` report theirs here, wherever they were imported."""
    import safetensors
    import tokenizers

    def safe_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        _audit("open", (path,))
        return real_safe_open(path, *args, **kwargs)

    class TokenizerProxy:
        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizers.Tokenizer, name)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return tokenizers.Tokenizer(*args, **kwargs)

        @staticmethod
        def from_file(path: str, *args: Any) -> Any:
            _audit("open", (path,))
            return tokenizers.Tokenizer.from_file(path, *args)

    real_safe_open = safetensors.safe_open
    proxy = TokenizerProxy()
    patched: list[tuple[Any, str, Any]] = []
    for module in list(sys.modules.values()):
        if module is tokenizers or module is safetensors:
            continue
        for name, value in list(getattr(module, "__dict__", {}).items()):
            swap = safe_open if value is real_safe_open else None
            swap = proxy if value is tokenizers.Tokenizer else swap
            if swap is not None:
                patched.append((module, name, value))
                setattr(module, name, swap)
    try:
        yield
    finally:
        for module, name, value in patched:
            setattr(module, name, value)


def _groups(directory: Path, weight_files: tuple[str, ...]) -> Any:
    names = [
        str(p.relative_to(directory)).replace(os.sep, "/")
        for p in directory.rglob("*")
        if p.is_file()
    ]
    return group_files(names, inputs=GroupingInputs(weight_files=weight_files))


def _build(directory: Path, model_type: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    if model_type in MULTIMODAL_TYPES:
        kwargs: dict[str, Any] = dict(
            text_config=_TEXT_CONFIG, vision_config=_VISION_CONFIG, projection_dim=8
        )
    else:
        kwargs = _SMALL
    model = AutoModel.from_config(AutoConfig.for_model(model_type, **kwargs))
    model.save_pretrained(directory)
    return model


def _inputs(model: Any) -> dict[str, Any]:
    import torch

    name = model.main_input_name
    if model.config.model_type in MULTIMODAL_TYPES:
        pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        return {"input_ids": torch.tensor([[3, 7, 1, 12, 5, 9]]), "pixel_values": pixels}
    if name == "pixel_values":
        return {name: torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
    if name == "input_values":
        return {name: torch.randn(1, 800, generator=torch.Generator().manual_seed(0))}
    ids = torch.tensor([[3, 7, 1, 12, 5, 9]])
    if model.config.is_encoder_decoder:
        return {name: ids, "decoder_input_ids": ids}
    return {name: ids}


LISTING: dict[str, dict[str, list[str]]] = {}


def _check_model(directory: Path, model_type: str) -> None:
    """AutoModel and a forward pass, the tokenizer or feature extractor; what they read."""
    import torch
    from transformers import AutoFeatureExtractor, AutoModel, AutoTokenizer

    fp = fingerprint(directory)
    groups = _groups(directory, ("model.safetensors",))
    with recording(directory) as model_reads:
        model: Any = AutoModel.from_pretrained(directory).eval()
        with torch.no_grad():
            model(**_inputs(model))
    config = json.loads((directory / "config.json").read_text())
    allowed = {"model.safetensors", "config.json", *groups.processor, *groups.code}
    allowed |= set(groups.generation)  # generation_config.json: read by generate() only
    assert model_reads.files <= allowed, (model_type, model_reads.files - allowed)
    dropped_read = (model_reads.members & set(config)) & set(CONFIG_DROPPED)
    assert dropped_read <= READ_BUT_INERT, (model_type, dropped_read - READ_BUT_INERT)
    LISTING[model_type] = {"model": sorted(model_reads.files)}
    if (directory / "preprocessor_config.json").exists():
        with recording(directory) as fe_reads:
            AutoFeatureExtractor.from_pretrained(directory)
        assert fe_reads.files <= {*groups.processor, "config.json"}, fe_reads.files
        LISTING[model_type]["feature_extractor"] = sorted(fe_reads.files)
    if (directory / "tokenizer_config.json").exists():
        assert fp.tokenizer is not None
        with recording(directory) as tok_reads:
            AutoTokenizer.from_pretrained(directory)
        allowed_tok = {*groups.tokenizer, *groups.generation, "config.json"}
        assert tok_reads.files <= allowed_tok, (model_type, tok_reads.files - allowed_tok)
        members = tok_reads.members & set(config)
        view = set(TOKENIZER_CONFIG_MEMBERS) | {"_name_or_path"}  # a path, set by the loader
        assert members <= view, (model_type, members - view)
        LISTING[model_type]["tokenizer"] = sorted(tok_reads.files)
        LISTING[model_type]["tokenizer config members"] = sorted(members)
    assert set(LISTING[model_type]["model"]) <= {*fp.files}


def test_oracle_stock_loaders_read_only_inputs_of_their_kinds(tmp_path: Path) -> None:
    from transformers import Wav2Vec2FeatureExtractor

    for model_type in (*TEXT_TYPES, *VISION_TYPES, *AUDIO_TYPES, *MULTIMODAL_TYPES):
        d = tmp_path / model_type
        _build(d, model_type)
        if model_type in (*TEXT_TYPES, *MULTIMODAL_TYPES):
            _word_tokenizer(d, ["the", "cache", "key", "weights"])
        if model_type in AUDIO_TYPES:
            Wav2Vec2FeatureExtractor(feature_size=1).save_pretrained(d)
        _check_model(d, model_type)
    assert len(LISTING) >= 39
    for model_type, read in LISTING.items():
        print(model_type, json.dumps(read))


def test_oracle_sentence_transformers_peft_and_remote_code(
    st_dense: Path,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoModelForCausalLM

    st = copy_model(st_dense, tmp_path / "st")
    with recording(st) as st_reads:
        SentenceTransformer(str(st), device="cpu").encode(["cache key"])
    fp = fingerprint(st)
    opened = st_reads.files - set(OPENED_BUT_INERT)
    assert opened <= set(fp.files), opened - set(fp.files)
    dense = [f for f in st_reads.files if "Dense" in f]
    assert dense and all(f in _groups(st, ("model.safetensors",)).embedding for f in dense)

    base = tmp_path / "base"
    _tiny_llama(0).save_pretrained(base)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj"])
    )
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(str(adapter))
    with recording(adapter) as peft_reads:
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter))
    assert peft_reads.files <= set(fingerprint(adapter, base=base).files), peft_reads.files

    remote = _data_model(tmp_path / "remote_oracle", 1.5, 0.5)
    with recording(remote) as code_reads:
        model: Any = AutoModel.from_pretrained(remote, trust_remote_code=True).eval()
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))
    groups = _groups(remote, ("model.safetensors",))
    in_code = {*groups.code, *groups.data, "model.safetensors"}
    assert {"assets/scale.json", "bias.safetensors"} <= code_reads.files <= in_code
    print("sentence-transformers", sorted(st_reads.files))
    print("peft", sorted(peft_reads.files))
    print("remote code", sorted(code_reads.files))
