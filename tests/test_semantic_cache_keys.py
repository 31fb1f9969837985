"""Cache keys a runtime can trust, checked against what tiny torch models really compute.

For each case of issue 17 a model is built from a tiny config (no download), the
output a key promises (the K cache for given token ids, logits, cross-attention K)
is computed with torch, and the ids are asserted equal exactly when the outputs are.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_support import run_runner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from remote_code_support import write_remote_code_model
from test_semantic import tensors, write_adapter, write_model

import cmh
from cmh.semantic import (
    LORA_DEFAULTS,
    PROCESSOR_FILES,
    CacheKindError,
    ModelFingerprint,
    NotAModelError,
    fingerprint,
    task_from_class,
)
from cmh.semantic._files import group_files


def tokenizer_file_names(names: list[str]) -> list[str]:
    """The names among ``names`` that are tokenizer inputs (no auto_map tokenizer code)."""
    return list(group_files(names, tokenizer_code=False).tokenizer)


pytestmark = pytest.mark.heavy

IDS = [[3, 7, 1, 12, 5, 9]]
ROOT = Path(__file__).resolve().parent.parent


# -- helpers ---------------------------------------------------------------------------


def k_cache(directory: Path, ids: list[list[int]] = IDS) -> Any:
    """The K cache of every layer after a forward pass over ``ids``, stacked."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        out = model(torch.tensor(ids), use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    return torch.stack([layer.keys for layer in cache.layers])


def max_diff(a: Any, b: Any) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max())


def kv_id(directory: Path) -> str:
    return fingerprint(directory).component("kv")


def copy_model(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def edit_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))


@dataclass(frozen=True)
class Zoo:
    root: Path

    def __truediv__(self, name: str) -> Path:
        return self.root / name


def _tiny_llama(seed: int, **overrides: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        **overrides,
    )
    return LlamaForCausalLM(config)


def _word_tokenizer(directory: Path, words: list[str]) -> None:
    """A BERT WordPiece tokenizer over ``words``, saved by transformers into ``directory``."""
    from transformers import BertTokenizer

    vocab = directory / "vocab-src.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    BertTokenizer(str(vocab)).save_pretrained(directory)
    vocab.unlink()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    """Tiny models saved once per module; tests copy what they change."""
    root = tmp_path_factory.mktemp("keys-zoo")
    llama = _tiny_llama(0)
    llama.save_pretrained(root / "llama")
    _word_tokenizer(root / "llama", ["the", "cache", "key", "weights"])
    llama.save_pretrained(root / "llama-sharded", max_shard_size="8KB")
    _tiny_llama(1).save_pretrained(root / "llama-other")
    return Zoo(root)


# -- different computation, same key: must never happen -----------------------------------


def test_stale_stamp_after_resave_with_copied_metadata(zoo: Zoo, tmp_path: Path) -> None:
    """Issue case 1: stamp, change a weight, re-save with the old metadata (cmh* copied)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    model = copy_model(zoo / "llama", tmp_path / "m")
    path = model / "model.safetensors"
    cmh.stamp(path)
    stamped = fingerprint(model)
    assert stamped.hashed_files == ()  # a fresh stamp is used: no tensor byte read
    before = k_cache(model)

    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        state = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    state["model.layers.0.self_attn.k_proj.weight"] += 0.5
    save_file(state, str(path), metadata=metadata)
    assert any(k.startswith("cmh") for k in metadata)

    after = k_cache(model)
    assert max_diff(before, after) > 1e-3
    assert not cmh.verify(path).ok
    resaved = fingerprint(model)
    assert resaved.hashed_files == ("model.safetensors",)
    assert "no check record" in dict(resaved.untrusted_stamps)["model.safetensors"]
    assert resaved.weights == cmh.directory_identity(model).hex != stamped.weights
    assert not resaved.compatible(stamped, "kv")
    assert not resaved.compatible(stamped, "weights")


def test_expired_stamp_is_not_trusted(zoo: Zoo, tmp_path: Path) -> None:
    """An expired stamp is hashed, even when the mtime looks right (as cp -p leaves it)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    model = copy_model(zoo / "llama", tmp_path / "m")
    path = model / "model.safetensors"
    long_ago = int(time.time()) - 7200
    cmh.stamp(path, ttl=60, now=long_ago)
    stamped_mtime = path.stat().st_mtime_ns
    assert stamped_mtime == long_ago * 1_000_000_000  # cmh stamp sets mtime to stamped_at
    claimed = fingerprint(model)
    assert claimed.hashed_files == ("model.safetensors",)
    assert "expired" in dict(claimed.untrusted_stamps)["model.safetensors"]

    before = k_cache(model)
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        state = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    state["model.layers.1.self_attn.k_proj.weight"] *= torch.tensor(-1.0)
    save_file(state, str(path), metadata=metadata)
    os.utime(path, ns=(stamped_mtime, stamped_mtime))  # the copy kept the old mtime
    assert max_diff(before, k_cache(model)) > 1e-3
    assert kv_id(model) != claimed.component("kv")

    # The same forged mtime on an unexpired stamp is believed: verify is what checks bytes.
    cmh.stamp(path, ttl="never")
    fresh = fingerprint(model)
    assert fresh.hashed_files == ()


def test_single_file_wins_over_a_stale_index(zoo: Zoo, tmp_path: Path) -> None:
    """Issue case 2: model.safetensors beside an index: transformers loads the single file."""
    mixed = copy_model(zoo / "llama-sharded", tmp_path / "mixed")
    shutil.copyfile(zoo / "llama-other" / "model.safetensors", mixed / "model.safetensors")
    assert (mixed / "model.safetensors.index.json").is_file()
    loaded = k_cache(mixed)
    assert max_diff(loaded, k_cache(zoo / "llama-other")) == 0.0
    assert max_diff(loaded, k_cache(zoo / "llama-sharded")) > 1e-3

    fp = fingerprint(mixed)
    assert fp.weights == fingerprint(zoo / "llama-other").weights
    assert fp.weights != fingerprint(zoo / "llama-sharded").weights
    assert "model.safetensors.index.json" not in fp.files
    assert kv_id(mixed) == kv_id(zoo / "llama-other") != kv_id(zoo / "llama-sharded")

    # The other way round: only the index and its shards are loaded.
    sharded = fingerprint(zoo / "llama-sharded")
    assert "model.safetensors.index.json" in sharded.files
    # A stale index whose shards are gone: transformers loads the single file, and so do we.
    for shard in mixed.glob("model-*.safetensors"):
        shard.unlink()
    assert max_diff(k_cache(mixed), loaded) == 0.0
    assert fingerprint(mixed).keys() == fp.keys()


def test_unused_consolidated_file_is_ignored(zoo: Zoo, tmp_path: Path) -> None:
    """An extra Mistral-style consolidated.safetensors is not loaded: same ids, no error."""
    model = copy_model(zoo / "llama-sharded", tmp_path / "m")
    before = fingerprint(model)
    shutil.copyfile(zoo / "llama-other" / "model.safetensors", model / "consolidated.safetensors")
    after = fingerprint(model)  # the names overlap the shards': this used to fail
    assert after.keys() == before.keys()
    assert max_diff(k_cache(model), k_cache(zoo / "llama-sharded")) == 0.0
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copyfile(zoo / "llama" / "config.json", alone / "config.json")
    shutil.copyfile(zoo / "llama" / "model.safetensors", alone / "consolidated.safetensors")
    assert fingerprint(alone).weights == fingerprint(zoo / "llama").weights


def test_several_unnamed_indexes_are_refused(zoo: Zoo, tmp_path: Path) -> None:
    model = copy_model(zoo / "llama-sharded", tmp_path / "m")
    index = model / "model.safetensors.index.json"
    shutil.copyfile(index, model / "a.safetensors.index.json")
    index.rename(model / "b.safetensors.index.json")
    with pytest.raises(NotAModelError, match="several safetensors indexes"):
        fingerprint(model)


def _remote_code_model(directory: Path, activation: str) -> Path:
    return write_remote_code_model(directory, activation)


def test_remote_code_is_covered(tmp_path: Path) -> None:
    """Issue case 3: modeling_*.py run by trust_remote_code changes what the model computes."""
    import torch
    from transformers import AutoModel

    relu = _remote_code_model(tmp_path / f"relu_{tmp_path.name}", "relu")
    tanh = _remote_code_model(tmp_path / f"tanh_{tmp_path.name}", "tanh")
    outputs = []
    for directory in (relu, tanh):
        model: Any = AutoModel.from_pretrained(directory, trust_remote_code=True).eval()
        with torch.no_grad():
            outputs.append(model(torch.tensor(IDS)))
    assert max_diff(outputs[0], outputs[1]) > 0.1
    a, b = fingerprint(relu), fingerprint(tanh)
    assert (a.weights, a.config, a.graph) == (b.weights, b.config, b.graph)
    assert a.code is not None and a.code != b.code
    assert "modeling_toy.py" in a.files and "configuration_toy.py" in a.files
    for kind in ("kv", "graph", "quant_weight"):
        assert not a.compatible(b, kind), kind
    assert a.compatible(b, "weights")


def _tiny_whisper(directory: Path, **extractor: Any) -> Path:
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    WhisperForConditionalGeneration(config).save_pretrained(directory)
    WhisperFeatureExtractor(feature_size=80, **extractor).save_pretrained(directory)
    return directory


def cross_attention_k(directory: Path) -> Any:
    """The decoder's cross-attention K of layer 0 for a fixed second of audio."""
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    extractor = WhisperFeatureExtractor.from_pretrained(directory)
    model: Any = WhisperForConditionalGeneration.from_pretrained(directory).eval()
    audio = np.sin(np.linspace(0, 2000, 16000)).astype(np.float32)
    features = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        encoded = model.model.encoder(features).last_hidden_state
        return model.model.decoder.layers[0].encoder_attn.k_proj(encoded)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_whisper(tmp_path_factory.mktemp("whisper") / "base")


@pytest.mark.parametrize(
    "change",
    [
        {"n_fft": 320},
        # Half the hop over half the window: still the 3000 frames the encoder takes.
        {"hop_length": 80, "chunk_length": 15, "n_samples": 240000},
    ],
    ids=["n_fft", "hop_length"],
)
def test_processor_files_are_covered(whisper: Path, tmp_path: Path, change: dict[str, int]) -> None:
    """Issue case 3: a feature-extractor setting changes cross-attention K: other ids."""
    other = tmp_path / "other"
    shutil.copytree(whisper, other)
    path = other / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    assert max_diff(cross_attention_k(whisper), cross_attention_k(other)) > 1e-4
    a, b = fingerprint(whisper), fingerprint(other)
    assert a.processor is not None and a.processor != b.processor
    assert "preprocessor_config.json" in a.files
    assert not a.compatible(b, "kv") and not a.compatible(b, "graph")
    assert a.compatible(b, "weights") and a.compatible(b, "quant_weight")


def test_whisper_training_only_fields_keep_the_kv_id(whisper: Path, tmp_path: Path) -> None:
    """SpecAugment settings are off at inference: same cross-attention K, same ids."""
    other = tmp_path / "other"
    shutil.copytree(whisper, other)
    edit_config(other, apply_spec_augment=True, mask_time_prob=0.3, dropout_rate=0.2)
    assert max_diff(cross_attention_k(whisper), cross_attention_k(other)) == 0.0
    assert fingerprint(other).keys() == fingerprint(whisper).keys()


def _vocab_names_in_transformers() -> set[str]:
    """Every file name in a ``VOCAB_FILES_NAMES`` table of the installed transformers."""
    import transformers

    names: set[str] = set()
    constants = {"TOKENIZER_FILE": "tokenizer.json", "TIKTOKEN_VOCAB_FILE": "tokenizer.model"}
    for path in Path(transformers.__file__).parent.rglob("*.py"):
        source = path.read_text(errors="ignore")
        if "VOCAB_FILES_NAMES" not in source:
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Dict):
                continue
            if not any(
                getattr(t, "id", getattr(t, "attr", "")) == "VOCAB_FILES_NAMES"
                for t in node.targets
            ):
                continue
            for value in node.value.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    names.add(value.value)
                elif isinstance(value, ast.Name):
                    names.add(constants[value.id])
    return names


def test_tokenizer_files_cover_transformers_tables() -> None:
    """Issue case 3: every file a transformers tokenizer class reads is a tokenizer file."""
    names = _vocab_names_in_transformers()
    assert len(names) > 20  # the scan found the tables
    missing = sorted(n for n in names if not tokenizer_file_names([n]))
    assert missing == []
    from transformers.tokenization_utils_base import (
        ADDED_TOKENS_FILE,
        SPECIAL_TOKENS_MAP_FILE,
        TOKENIZER_CONFIG_FILE,
    )

    assert {ADDED_TOKENS_FILE, SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE} <= set(
        tokenizer_file_names([ADDED_TOKENS_FILE, SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE])
    )
    from transformers.utils import (
        AUDIO_TOKENIZER_NAME,
        FEATURE_EXTRACTOR_NAME,
        IMAGE_PROCESSOR_NAME,
        PROCESSOR_NAME,
        VIDEO_PROCESSOR_NAME,
    )

    assert {
        AUDIO_TOKENIZER_NAME,
        FEATURE_EXTRACTOR_NAME,
        IMAGE_PROCESSOR_NAME,
        PROCESSOR_NAME,
        VIDEO_PROCESSOR_NAME,
    } <= set(PROCESSOR_FILES)
    assert tokenizer_file_names(["qwen.tiktoken", "tokenization_toy.py", "README.md"]) == [
        "qwen.tiktoken",
    ]  # code joins the tokenizer id only when an auto_map names a tokenizer class


@pytest.mark.parametrize("name", ["spm.model", "dict.txt", "vocab-src.json", "qwen.tiktoken"])
def test_tokenizer_files_outside_the_old_list_change_the_id(
    zoo: Zoo, tmp_path: Path, name: str
) -> None:
    model = copy_model(zoo / "llama", tmp_path / "m")
    (model / name).write_text(json.dumps({"first": 0}) if name.endswith(".json") else "first\n")
    first = fingerprint(model)
    (model / name).write_text(json.dumps({"second": 0}) if name.endswith(".json") else "second\n")
    second = fingerprint(model)
    assert name in first.files
    assert first.tokenizer != second.tokenizer
    assert not first.compatible(second, "tokenizer")
    assert not first.compatible(second, "kv_text")


def test_tokenizer_file_outside_the_old_list_changes_encodings(tmp_path: Path) -> None:
    """RoCBert reads word_shape.json (not in the v1 list): its ids are model inputs."""
    from transformers import AutoTokenizer, RoCBertTokenizer

    source = tmp_path / "source"
    source.mkdir()
    (source / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n你\n好\n")
    (source / "word_shape.json").write_text(json.dumps({"你": 3, "好": 4, "[UNK]": 0}))
    (source / "word_pronunciation.json").write_text(json.dumps({"你": 5, "好": 6, "[UNK]": 0}))
    tokenizer = RoCBertTokenizer(
        str(source / "vocab.txt"),
        str(source / "word_shape.json"),
        str(source / "word_pronunciation.json"),
    )
    model = write_model(tmp_path / "a", tensors())
    tokenizer.save_pretrained(model)
    other = copy_model(model, tmp_path / "b")
    (other / "word_shape.json").write_text(json.dumps({"你": 4, "好": 3, "[UNK]": 0}))
    encodings = [AutoTokenizer.from_pretrained(d)("你好") for d in (model, other)]
    assert encodings[0]["input_ids"] == encodings[1]["input_ids"]
    assert encodings[0]["input_shape_ids"] != encodings[1]["input_shape_ids"]
    a, b = fingerprint(model), fingerprint(other)
    assert "word_shape.json" in a.files
    assert not a.compatible(b, "tokenizer") and not a.compatible(b, "kv_text")


def test_adapter_with_partial_tokenizer_keeps_its_base_tokenizer(tmp_path: Path) -> None:
    """Issue case 4: only tokenizer_config.json in the adapter; the bases' vocabularies differ."""
    from transformers import AutoTokenizer

    bases = []
    for name, words in [("a", ["cache", "key"]), ("b", ["key", "cache"])]:
        base = write_model(tmp_path / name, tensors())
        _word_tokenizer(base, words)
        bases.append(base)
    adapter = write_adapter(tmp_path / "adapter")
    shutil.copyfile(bases[0] / "tokenizer_config.json", adapter / "tokenizer_config.json")
    # What a runtime tokenizes with: the adapter's config over each base's vocabulary.
    ids = []
    for base in bases:
        merged = tmp_path / f"merged-{base.name}"
        shutil.copytree(base, merged)
        shutil.copyfile(adapter / "tokenizer_config.json", merged / "tokenizer_config.json")
        ids.append(AutoTokenizer.from_pretrained(merged)("cache key")["input_ids"])
    assert ids[0] != ids[1]

    on_a, on_b = (fingerprint(adapter, base=base) for base in bases)
    assert fingerprint(bases[0]).weights == fingerprint(bases[1]).weights
    assert on_a.tokenizer == on_b.tokenizer  # the adapter's own file is the same
    assert not on_a.compatible(on_b, "tokenizer")
    assert not on_a.compatible(on_b, "kv_text")
    assert on_a.compatible(on_b, "kv")  # same weights and adapter: same K/V for given ids
    with pytest.raises(CacheKindError, match="base model"):
        fingerprint(adapter).cache_key("tokenizer")


# -- same computation, one key ---------------------------------------------------------------


def test_transformers_4_and_5_config_spellings(zoo: Zoo, tmp_path: Path) -> None:
    """torch_dtype/dtype and rope_theta/rope_parameters: same K cache, same ids."""
    v5 = zoo / "llama"
    config = json.loads((v5 / "config.json").read_text())
    assert "rope_parameters" in config and "dtype" in config  # written by transformers 5
    v4 = copy_model(v5, tmp_path / "v4")
    rope = config["rope_parameters"]
    edit_config(
        v4,
        dtype=None,
        torch_dtype=config["dtype"],
        rope_parameters=None,
        rope_theta=rope["rope_theta"],
        rope_scaling=None,
    )
    assert max_diff(k_cache(v4), k_cache(v5)) == 0.0
    assert fingerprint(v4).keys() == fingerprint(v5).keys()

    theta = copy_model(v4, tmp_path / "theta")
    edit_config(theta, rope_theta=rope["rope_theta"] * 2)
    assert max_diff(k_cache(theta), k_cache(v5)) > 1e-4
    assert kv_id(theta) != kv_id(v5)

    scaled = copy_model(v4, tmp_path / "scaled")
    edit_config(scaled, rope_scaling={"type": "linear", "factor": 2.0})
    scaled5 = copy_model(v5, tmp_path / "scaled5")
    edit_config(
        scaled5,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": rope["rope_theta"]},
    )
    assert max_diff(k_cache(scaled), k_cache(scaled5)) == 0.0
    assert max_diff(k_cache(scaled), k_cache(v5)) > 1e-4
    assert kv_id(scaled) == kv_id(scaled5) != kv_id(v5)


def test_config_fields_that_do_not_change_kv(zoo: Zoo, tmp_path: Path) -> None:
    """Token ids, generate() settings, labels: same K cache, yet kv splits (not argued
    inert); training-only fields and provenance (argued inert): same kv id."""
    base = zoo / "llama"
    other = copy_model(base, tmp_path / "other")
    edit_config(
        other,
        bos_token_id=5,
        eos_token_id=6,
        id2label={"0": "NO", "1": "YES"},
        label2id={"NO": 0, "YES": 1},
        problem_type="single_label_classification",
        task_specific_params={"summarization": {"num_beams": 4}},
        max_length=99,
        temperature=0.3,
        num_beams=3,
        dropout_rate=0.5,
    )
    assert max_diff(k_cache(base), k_cache(other)) == 0.0
    a, b = fingerprint(base), fingerprint(other)
    # v3: token ids and generation settings are not argued inert (a forward pass may read
    # them, as qwen4_exp reads eos_token_id): a false split, never a false share.
    assert not a.compatible(b, "kv") and not a.compatible(b, "graph")
    # labels and problem_type are not inert either (spec 5): a false split here, since
    # AutoModelForCausalLM reads neither; a classification head or pipeline reads them
    labels_only = copy_model(base, tmp_path / "labels")
    edit_config(labels_only, id2label={"0": "A", "1": "B"}, problem_type="regression")
    assert not fingerprint(labels_only).compatible(a, "kv")
    provenance_only = copy_model(base, tmp_path / "provenance")
    edit_config(provenance_only, _name_or_path="/x", dropout_rate=0.5)
    assert fingerprint(provenance_only).keys() == a.keys()

    padded = copy_model(base, tmp_path / "pad")  # RoBERTa derives positions from the pad id
    edit_config(padded, pad_token_id=3)
    assert kv_id(padded) != a.component("kv")


def test_older_peft_adapter_config(zoo: Zoo, tmp_path: Path) -> None:
    """Adapter configs without default-valued fields (older PEFT): same logits, same ids."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = zoo / "llama"
    torch.manual_seed(3)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(
            r=4, lora_alpha=16, target_modules=["q_proj", "k_proj"], init_lora_weights=False
        ),
    )
    new = tmp_path / "new"
    peft_model.save_pretrained(str(new))
    old = copy_model(new, tmp_path / "old")
    config = json.loads((new / "adapter_config.json").read_text())
    slim = {k: v for k, v in config.items() if not (k in LORA_DEFAULTS and v == LORA_DEFAULTS[k])}
    assert len(slim) < len(config) - 10
    (old / "adapter_config.json").write_text(json.dumps(slim))

    def logits(adapter: Path) -> Any:
        model: Any = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
        with torch.no_grad():
            return model(torch.tensor(IDS)).logits

    assert max_diff(logits(new), logits(old)) == 0.0
    a, b = fingerprint(new, base=base), fingerprint(old, base=base)
    assert a.keys() == b.keys()
    rslora = copy_model(old, tmp_path / "rslora")
    (rslora / "adapter_config.json").write_text(json.dumps({**slim, "use_rslora": True}))
    assert max_diff(logits(rslora), logits(old)) > 1e-4
    assert not fingerprint(rslora, base=base).compatible(b, "kv")


def test_lora_defaults_match_peft() -> None:
    """The LoRA defaults table is PEFT's: every saved field with its default value."""
    import dataclasses

    from peft import LoraConfig

    defaults = LoraConfig().to_dict()
    fields = {f.name for f in dataclasses.fields(LoraConfig)}
    for key, value in LORA_DEFAULTS.items():
        assert key in fields, key
        assert defaults[key] == value, key
    kept = {
        "task_type",
        "peft_type",
        "target_modules",
        "base_model_name_or_path",
        "revision",
        "inference_mode",
        "init_lora_weights",
        "lora_dropout",
        "peft_version",
        "runtime_config",
    }
    missing = sorted(fields - set(LORA_DEFAULTS) - kept)
    assert missing == []


# -- the rules: kv and the tokenizer, scopes, labels ------------------------------------------


def test_tokenizer_change_keeps_kv_and_changes_kv_text(zoo: Zoo, tmp_path: Path) -> None:
    """K/V for given ids do not depend on the tokenizer; text-keyed K/V do (kv_text)."""
    base = zoo / "llama"
    other = copy_model(base, tmp_path / "other")
    path = other / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "padding_side": "left"}))
    a, b = fingerprint(base), fingerprint(other)
    assert a.compatible(b, "kv")
    assert not a.compatible(b, "tokenizer") and not a.compatible(b, "kv_text")
    assert a.cache_key("kv") == b.cache_key("kv")


def test_scopes_let_runtimes_share_and_evict(zoo: Zoo, tmp_path: Path) -> None:
    """Keys are equal exactly when compatible(); adapter entries carry their base's scope."""
    base, other = fingerprint(zoo / "llama"), fingerprint(zoo / "llama-other")
    assert base.cache_key("graph") == other.cache_key("graph")  # a fine-tune shares graphs
    assert base.cache_key("tokenizer").split("/")[0] == base.tokenizer[:16]  # type: ignore[index]
    adapter = fingerprint(write_adapter(tmp_path / "adapter"), base=zoo / "llama")
    for kind in ("kv", "quant_weight"):
        assert adapter.cache_key(kind).startswith(base.scope + "/")
    assert adapter.cache_key("lora").startswith(adapter.scope + "/")
    assert adapter.cache_key("weights").startswith(adapter.scope + "/")
    for one in (base, other, adapter):
        for two in (base, other, adapter):
            for kind, key in one.keys().items():
                if key is not None:
                    assert (key == two.keys()[kind]) == one.compatible(two, kind), kind


@pytest.mark.parametrize(
    ("family", "task"),
    [
        ("GPT2DoubleHeadsModel", "causal-lm"),
        ("EncoderDecoderModel", "conditional-generation"),
        ("MarianMTModel", "conditional-generation"),
        ("VisionEncoderDecoderModel", "conditional-generation"),
        ("SpeechEncoderDecoderModel", "conditional-generation"),
        ("CLIPTextModelWithProjection", "feature-extraction"),
        ("CLIPVisionModelWithProjection", "feature-extraction"),
        ("DPRQuestionEncoder", "feature-extraction"),
        ("DPRContextEncoder", "feature-extraction"),
        ("DPRReader", "question-answering"),
        ("ReformerModelWithLMHead", "causal-lm"),
    ],
)
def test_task_of_classes_without_a_for_head(family: str, task: str) -> None:
    assert task_from_class(family) == task


def test_tasks_agree_with_transformers_auto_tables() -> None:
    """Every class in transformers' task tables gets that task (seq2seq: a generation task)."""
    from transformers.models.auto import modeling_auto as auto

    expected: dict[str, set[str]] = {
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": {"sequence-classification"},
        "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": {"token-classification"},
        "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": {"multiple-choice"},
        "MODEL_FOR_CTC_MAPPING_NAMES": {"ctc"},
        "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": {"conditional-generation", "text-to-text"},
    }
    for table, tasks in expected.items():
        for classes in getattr(auto, table).values():
            for name in [classes] if isinstance(classes, str) else classes:
                assert task_from_class(name) in tasks, (table, name)
    base_classes = auto.MODEL_MAPPING_NAMES.values()
    for name in [c for c in base_classes if isinstance(c, str) and c.endswith("Encoder")]:
        assert task_from_class(name) == "feature-extraction", name


# -- the command line -------------------------------------------------------------------------


def test_cli_base_and_threads(zoo: Zoo, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter")
    plain = run_runner(["fingerprint", adapter, "--semantic", "--json"])
    assert plain.exit_code == 0, plain.stderr
    assert plain.json()["semantic"]["keys"]["kv"] is None
    based = run_runner(
        ["fingerprint", adapter, "--semantic", "--base", zoo / "llama", "--threads", "1", "--json"]
    )
    assert based.exit_code == 0, based.stderr
    doc = based.json()["semantic"]
    expected = fingerprint(adapter, base=zoo / "llama")
    assert doc["keys"]["kv"] == expected.cache_key("kv")
    assert ModelFingerprint.from_dict(doc) == expected
    assert doc["base"]["weights"] == fingerprint(zoo / "llama").weights
    wrong = run_runner(["fingerprint", adapter, "--base", zoo / "llama"])
    assert wrong.exit_code == 2 and "--semantic" in wrong.stderr
    not_adapter = run_runner(
        ["fingerprint", zoo / "llama", "--semantic", "--base", zoo / "llama", "--json"]
    )
    assert not_adapter.exit_code != 0 and "adapter" in not_adapter.json()["error"]
    bad_threads = run_runner(["fingerprint", zoo / "llama", "--semantic", "--threads", "0"])
    assert bad_threads.exit_code == 2


# -- property: ids equal exactly when the outputs are -------------------------------------------

TEXT = "the cache key weights"


def _tiny_gpt2(seed: int) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=64)
    )


def _tiny_qwen2(seed: int) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )
    )


#: Tiny models the property draws from: name -> builder(seed).
ARCHITECTURES: dict[str, Callable[[int], Any]] = {
    "llama": _tiny_llama,
    "gpt2": _tiny_gpt2,
    "qwen2": _tiny_qwen2,
}
#: Per architecture: the config names of the norm epsilon and the activation.
EPS = {"llama": "rms_norm_eps", "gpt2": "layer_norm_epsilon", "qwen2": "rms_norm_eps"}
ACT = {"llama": "hidden_act", "gpt2": "activation_function", "qwen2": "hidden_act"}
HAS_ROPE = {"llama": True, "gpt2": False, "qwen2": True}

#: Perturbations of a saved model: each rewrites the directory in place.
Perturbation = Callable[[Path, str], None]


def _resave_sharded(d: Path, arch: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d)
    (d / "model.safetensors").unlink()
    model.save_pretrained(d, max_shard_size="8KB")


def _stamp(d: Path, arch: str) -> None:
    for path in d.glob("*.safetensors"):
        cmh.stamp(path)


def _nudge_weight(d: Path, arch: str) -> None:
    """Add 0.25 to one value of the first layer-0 tensor (its K, or the next layer's, moves)."""
    from safetensors.torch import load_file, save_file

    files = sorted(d.glob("*.safetensors"))
    for path in files:
        state = load_file(str(path))
        names = sorted(n for n in state if ".0." in n)
        if names:
            state[names[0]].view(-1)[0] += 0.25
            save_file(state, str(path), {"format": "pt"})
            return
    raise AssertionError("no layer-0 tensor")


def _v4_rope(d: Path, arch: str) -> None:
    config = json.loads((d / "config.json").read_text())
    rope = config.get("rope_parameters")
    if rope:
        edit_config(d, rope_parameters=None, rope_theta=rope["rope_theta"], rope_scaling=None)


def _swap_vocabulary(d: Path, arch: str) -> None:
    """Swap the ids of two words in the saved tokenizer.json."""
    path = d / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["the"], vocab["cache"] = vocab["cache"], vocab["the"]
    path.write_text(json.dumps(tokenizer))


PERTURBATIONS: dict[str, Perturbation] = {
    "resave-sharded": _resave_sharded,
    "stamp": _stamp,
    "nudge-weight": _nudge_weight,
    "rope-theta": lambda d, arch: (
        edit_config(d, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
        if HAS_ROPE[arch]
        else None
    ),
    "eps": lambda d, arch: edit_config(d, **{EPS[arch]: 1e-2}),
    "act": lambda d, arch: edit_config(d, **{ACT[arch]: "relu"}),
    "eos-id": lambda d, arch: edit_config(d, eos_token_id=7, bos_token_id=6),
    "labels": lambda d, arch: edit_config(d, id2label={"0": "x"}, label2id={"x": 0}),
    "generation": lambda d, arch: edit_config(d, task_specific_params={"x": {"num_beams": 2}}),
    "provenance": lambda d, arch: edit_config(d, _name_or_path="/x", transformers_version="4.0"),
    "v4-dtype": lambda d, arch: edit_config(d, torch_dtype="float32", dtype=None),
    "v4-rope": _v4_rope,
    "vocabulary": _swap_vocabulary,
}

#: Whether each perturbation alone changes the K cache (checked with torch below).
CHANGES_K: dict[str, bool] = {
    "resave-sharded": False,
    "stamp": False,
    "nudge-weight": True,
    "rope-theta": True,
    "eps": True,
    "act": True,
    "eos-id": False,
    "labels": False,
    "generation": False,
    "provenance": False,
    "v4-dtype": False,
    "v4-rope": False,
    "vocabulary": False,
}


#: Whether the kv key stays equal: where K does not change and nothing outside the
#: argued inert lists changed. ``eos-id``, ``generation`` and ``labels`` are v3's accepted
#: false splits (every config field not argued inert is in kv: qwen4_exp reads eos in
#: forward; a head the checkpoint lacks is sized by len(id2label), pipelines read labels).
KV_SHARED: dict[str, bool] = {
    name: not changes and name not in ("eos-id", "generation", "labels")
    for name, changes in CHANGES_K.items()
}


@dataclass(frozen=True)
class Outputs:
    """What the keys promise, computed: the K cache of IDS, the token ids of TEXT.

    ``saved_class`` is false when AutoTokenizer did not load the tokenizer class
    that was saved (transformers 5 picks ``Qwen2Tokenizer`` for a ``qwen2`` config
    whatever ``tokenizer_class`` says): its ids then ignore the saved files.
    """

    k: Any
    token_ids: list[int]
    saved_class: bool


def outputs(directory: Path) -> Outputs:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    saved = json.loads((directory / "tokenizer_config.json").read_text())["tokenizer_class"]
    return Outputs(
        k_cache(directory),
        tokenizer(TEXT)["input_ids"],
        type(tokenizer).__name__.removesuffix("Fast") == saved.removesuffix("Fast"),
    )


@pytest.fixture(scope="module")
def property_models(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, Outputs, ModelFingerprint]]:
    root = tmp_path_factory.mktemp("property")
    out = {}
    for name, build in ARCHITECTURES.items():
        directory = root / name
        build(0).save_pretrained(directory)
        _word_tokenizer(directory, TEXT.split())
        out[name] = (directory, outputs(directory), fingerprint(directory))
    return out


def _check_promises(
    base: tuple[Path, Outputs, ModelFingerprint], directory: Path
) -> tuple[bool, bool]:
    """Assert no key is shared where its output differs (v3 accepts false splits);
    return whether K changed and whether the kv key stayed equal."""
    _, before, base_fp = base
    after, fp = outputs(directory), fingerprint(directory)
    k_changed = max_diff(after.k, before.k) > 0.0
    tokens_changed = after.token_ids != before.token_ids
    kv_shared = fp.compatible(base_fp, "kv")
    assert not (k_changed and kv_shared)
    assert not (tokens_changed and fp.compatible(base_fp, "tokenizer"))
    assert not ((k_changed or tokens_changed) and fp.compatible(base_fp, "kv_text"))
    return k_changed, kv_shared


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_each_perturbation(
    property_models: dict[str, tuple[Path, Outputs, ModelFingerprint]], tmp_path: Path, name: str
) -> None:
    """Each perturbation alone, on Llama: the K cache changes as listed, the ids with it."""
    base = property_models["llama"]
    directory = copy_model(base[0], tmp_path / "m")
    PERTURBATIONS[name](directory, "llama")
    assert _check_promises(base, directory) == (CHANGES_K[name], KV_SHARED[name])


@settings(
    max_examples=16,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    arch=st.sampled_from(sorted(ARCHITECTURES)),
    names=st.lists(st.sampled_from(sorted(PERTURBATIONS)), min_size=1, max_size=3, unique=True),
)
def test_ids_equal_exactly_when_outputs_are(
    property_models: dict[str, tuple[Path, Outputs, ModelFingerprint]],
    tmp_path_factory: pytest.TempPathFactory,
    arch: str,
    names: list[str],
) -> None:
    """Over tiny models of three architectures and combined perturbations: kv, tokenizer
    and kv_text ids are equal exactly when the K cache and the token ids are."""
    base = property_models[arch]
    directory = tmp_path_factory.mktemp("perturbed") / "m"
    shutil.copytree(base[0], directory)
    for name in names:
        PERTURBATIONS[name](directory, arch)
    _check_promises(base, directory)
