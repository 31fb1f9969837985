"""Semantic fingerprints of tiny BERT, GPT-2 and Llama models saved by transformers, and PEFT."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import cmh
from cmh.semantic import ModelFingerprint, fingerprint

pytestmark = pytest.mark.heavy

#: Shard sizes that split each tiny model into several files.
SHARD = {"bert": "200KB", "bert-b": "200KB", "gpt2": "20KB", "llama": "20KB"}


@dataclass(frozen=True)
class Zoo:
    root: Path
    expected: dict[str, tuple[str, str, str]]


def _bpe_tokenizer() -> Any:
    """A small byte-level BPE tokenizer trained here (GPT-2 style), wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = ["the cache keys follow the weights", "a model name is not its content"] * 20
    tok.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Zoo:
    """Tiny models built from configs, each saved unsharded and sharded."""
    import torch
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        BertModel,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    root = tmp_path_factory.mktemp("zoo")
    bert_tok = AutoTokenizer.from_pretrained(minilm_dir)
    minilm_elsewhere = root / "minilm-elsewhere"
    shutil.copytree(minilm_dir, minilm_elsewhere, ignore=shutil.ignore_patterns("*.safetensors"))
    bert_tok_elsewhere = AutoTokenizer.from_pretrained(minilm_elsewhere)
    gpt2_tok = _bpe_tokenizer()

    torch.manual_seed(0)
    small: dict[str, Any] = {
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
    }
    models: dict[str, tuple[Any, Any]] = {
        "bert": (
            BertForMaskedLM(
                BertConfig(
                    vocab_size=bert_tok.vocab_size, hidden_size=8, intermediate_size=16, **small
                )
            ),
            bert_tok,
        ),
        "bert-b": (
            BertModel(
                BertConfig(
                    vocab_size=bert_tok.vocab_size, hidden_size=12, intermediate_size=24, **small
                )
            ),
            bert_tok_elsewhere,
        ),
        "gpt2": (
            GPT2LMHeadModel(
                GPT2Config(vocab_size=len(gpt2_tok), n_embd=16, n_layer=2, n_head=2, n_positions=64)
            ),
            gpt2_tok,
        ),
        "llama": (
            LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=len(gpt2_tok),
                    hidden_size=32,
                    intermediate_size=64,
                    num_key_value_heads=1,
                    **small,
                )
            ),
            gpt2_tok,
        ),
    }
    for name, (model, tokenizer) in models.items():
        model.save_pretrained(root / name)
        model.save_pretrained(root / f"{name}-sharded", max_shard_size=SHARD[name])
        tokenizer.save_pretrained(root / name)
        tokenizer.save_pretrained(root / f"{name}-sharded")
    return Zoo(
        root,
        {
            "bert": ("bert", "BertForMaskedLM", "masked-lm"),
            "bert-b": ("bert", "BertModel", "feature-extraction"),
            "gpt2": ("gpt2", "GPT2LMHeadModel", "causal-lm"),
            "llama": ("llama", "LlamaForCausalLM", "causal-lm"),
        },
    )


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_sharded_and_unsharded_saves_same_weights(zoo: Zoo, name: str) -> None:
    one, sharded_dir = zoo.root / name, zoo.root / f"{name}-sharded"
    assert len(list(sharded_dir.glob("*.safetensors"))) > 1
    assert (sharded_dir / "model.safetensors.index.json").is_file()
    single, sharded = fingerprint(one), fingerprint(sharded_dir)
    assert (single.arch, single.family, single.task) == zoo.expected[name]
    assert single.weights == cmh.directory_identity(one).hex
    assert (sharded.weights, sharded.graph, sharded.config, sharded.tokenizer) == (
        single.weights,
        single.graph,
        single.config,
        single.tokenizer,
    )
    assert sharded.keys() == single.keys()
    assert sharded.files != single.files
    assert ModelFingerprint.from_dict(sharded.to_dict()) == sharded


def test_stamped_shards_read_headers_only(zoo: Zoo, tmp_path: Path) -> None:
    directory = tmp_path / "llama-sharded"
    shutil.copytree(zoo.root / "llama-sharded", directory)
    shards = sorted(directory.glob("*.safetensors"))
    for shard in shards:
        cmh.stamp(shard)
    fp = fingerprint(directory)
    assert fp.hashed_files == ()
    assert fp.weights == fingerprint(zoo.root / "llama").weights
    # Change a tensor without restamping: that shard's stamp is no longer used.
    header = cmh.read_header(shards[0])
    t = header.tensors[-1]
    with open(shards[0], "r+b") as f:
        f.seek(header.data_start + t.begin)
        f.write(b"\x7f" * t.nbytes)
    changed = fingerprint(directory)
    assert changed.hashed_files == (shards[0].name,)
    assert changed.weights == cmh.directory_identity(directory).hex != fp.weights


def test_fine_tuned_copy_same_graph_other_weights(zoo: Zoo, tmp_path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    source = zoo.root / "gpt2"
    model: Any = GPT2LMHeadModel.from_pretrained(source)
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.add_(0.01)
    tuned_dir = tmp_path / "gpt2-tuned"
    model.save_pretrained(tuned_dir)
    AutoTokenizer.from_pretrained(source).save_pretrained(tuned_dir)
    base, tuned = fingerprint(source), fingerprint(tuned_dir)
    assert tuned.graph == base.graph
    assert tuned.config == base.config  # reloaded and re-saved by transformers
    assert tuned.tokenizer == base.tokenizer
    assert tuned.weights != base.weights
    assert tuned.compatible(base, "graph") and tuned.compatible(base, "tokenizer")
    assert not tuned.compatible(base, "weights")
    assert not tuned.compatible(base, "kv")


def test_models_sharing_a_tokenizer(zoo: Zoo) -> None:
    a, b = fingerprint(zoo.root / "bert"), fingerprint(zoo.root / "bert-b")
    gpt2 = fingerprint(zoo.root / "gpt2")
    assert a.tokenizer is not None and a.tokenizer == b.tokenizer
    assert a.compatible(b, "tokenizer")
    assert a.cache_key("tokenizer").split("/", 1)[1] == b.cache_key("tokenizer").split("/", 1)[1]
    for kind in ("kv", "weights", "graph", "quant_weight"):
        assert not a.compatible(b, kind), kind
    assert not a.compatible(gpt2, "tokenizer")


def test_peft_lora_adapter(zoo: Zoo, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaForCausalLM

    base_dir = zoo.root / "llama"
    peft_model = get_peft_model(
        LlamaForCausalLM.from_pretrained(base_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    adapter_dir = tmp_path / "lora"
    peft_model.save_pretrained(str(adapter_dir))
    assert PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir), adapter_dir)

    fp = fingerprint(adapter_dir)
    base = fingerprint(base_dir)
    assert fp.is_adapter and fp.adapter_type == "LORA"
    assert fp.base_model == str(base_dir)
    assert fp.task == "causal-lm"
    assert fp.weights == cmh.directory_identity(adapter_dir).hex != base.weights
    assert fp.cache_key("lora").startswith(fp.scope + "/lora/")
    on_base = fingerprint(adapter_dir, base=base_dir)
    assert on_base.effective_tokenizer == base.tokenizer
    assert on_base.compatible(base, "tokenizer")
    assert not on_base.compatible(base, "kv")
    assert on_base.compatible(base, "quant_weight")
    assert not on_base.compatible(base, "weights")
