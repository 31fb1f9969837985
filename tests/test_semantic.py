"""Semantic fingerprints on the real MiniLM model and on synthetic checkpoints (no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

import cmh
from cmh.semantic import (
    CACHE_KINDS,
    CacheKindError,
    FingerprintFormatError,
    ModelFingerprint,
    NotAModelError,
    SemanticError,
    canonical_json,
    fingerprint,
    fingerprint_files,
    task_from_class,
)

ROOT = Path(__file__).resolve().parent.parent
KEY = re.compile(
    r"^[0-9a-f]{16}/(weights|lora|kv|kv_text|tokenizer|graph|quant_weight)/[0-9a-f]{64}$"
)


# -- helpers ---------------------------------------------------------------------------


def spec_graph(paths: list[Path]) -> str:
    """The spec's graph hash, computed with the reference safetensors parser."""
    entries = []
    for path in paths:
        with safe_open(str(path), "np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                sl = f.get_slice(name)
                entries.append((name.encode(), sl.get_dtype().encode(), sl.get_shape()))
    entries.sort(key=lambda e: e[0])
    h = hashlib.sha256(b"CMH-SEM-GRAPH-v1\n" + struct.pack("<Q", len(entries)))
    for name, dtype, shape in entries:
        h.update(struct.pack("<I", len(name)) + name + struct.pack("<I", len(dtype)) + dtype)
        h.update(struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape))
    return h.hexdigest()


def tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "layers.0.attn.weight": rng.standard_normal((8, 8)).astype(np.float16),
        "layers.0.mlp.weight": rng.standard_normal((8, 12)).astype(np.float32),
        "layers.1.attn.weight": rng.standard_normal((8, 8)).astype(np.float16),
        "layers.1.mlp.weight": rng.standard_normal((8, 12)).astype(np.float32),
        "norm.weight": np.ones(8, dtype=np.float32),
    }


CONFIG = {
    "architectures": ["ToyForCausalLM"],
    "model_type": "toy",
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "rope_theta": 10000.0,
    "_name_or_path": "org/toy",
    "transformers_version": "4.50.0",
}


def write_model(directory: Path, state: dict[str, np.ndarray], shards: int = 1) -> Path:
    """A model directory: config.json and ``shards`` safetensors files (index when > 1)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=2))
    if shards == 1:
        save_file(state, str(directory / "model.safetensors"), {"format": "pt"})
        return directory
    names = sorted(state)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        # Reverse insertion order too: the layout must not matter.
        save_file({n: state[n] for n in reversed(part)}, str(directory / file), {"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def write_adapter(directory: Path, seed: int = 0, **config: object) -> Path:
    """A PEFT-layout LoRA adapter written with code: adapter_config.json + safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    r = int(config.get("r", 4))  # type: ignore[call-overload]
    state = {}
    for layer in range(2):
        prefix = f"base_model.model.layers.{layer}.attn"
        state[f"{prefix}.lora_A.weight"] = rng.standard_normal((r, 8)).astype(np.float32)
        state[f"{prefix}.lora_B.weight"] = rng.standard_normal((8, r)).astype(np.float32)
    save_file(state, str(directory / "adapter_model.safetensors"), {"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "org/toy",
        "r": r,
        "lora_alpha": 8,
        "lora_dropout": 0.05,
        "target_modules": ["attn", "mlp"],
        "inference_mode": True,
        **config,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config))
    return directory


def overwrite_tensor_bytes(path: Path, name: str) -> None:
    """Flip every byte of one tensor in place (header untouched: no restamp)."""
    header = cmh.read_header(path)
    t = header.by_name()[name]
    with open(path, "r+b") as f:
        f.seek(header.data_start + t.begin)
        data = f.read(t.nbytes)
        f.seek(header.data_start + t.begin)
        f.write(data.translate(bytes(b ^ 0xFF for b in range(256))))


# -- the real MiniLM model ---------------------------------------------------------------


def test_import_reads_no_torch_or_transformers() -> None:
    code = (
        "import sys, cmh.semantic\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_minilm_fields(minilm_dir: Path) -> None:
    fp = fingerprint(minilm_dir)
    assert (fp.arch, fp.family, fp.task) == ("bert", "BertModel", "feature-extraction")
    assert fp.weights == cmh.directory_identity(minilm_dir).hex
    assert fp.graph == spec_graph([minilm_dir / "model.safetensors"])
    assert fp.scope == fp.weights[:16]
    assert fp.tokenizer is not None and fp.config is not None
    assert fp.hashed_files == ("model.safetensors",)  # unstamped: hashed
    assert fp.tensor_count == 104
    assert "vocab.txt" in fp.files and "tokenizer.json" in fp.files
    assert not fp.is_adapter and fp.base is None
    for kind in ("weights", "kv", "kv_text", "tokenizer", "graph", "quant_weight"):
        assert KEY.match(fp.cache_key(kind)), kind
    assert fp.cache_key("weights") == f"{fp.scope}/weights/{fp.weights}"
    # Shared kinds are scoped by their own content, weight-bound kinds by the weights.
    assert fp.cache_key("tokenizer") == f"{fp.tokenizer[:16]}/tokenizer/{fp.tokenizer}"
    for kind in ("kv", "kv_text", "quant_weight"):
        assert fp.cache_key(kind).startswith(f"{fp.scope}/{kind}/")
    with pytest.raises(CacheKindError, match="adapters only"):
        fp.cache_key("lora")
    data = json.loads(json.dumps(fp.to_dict()))
    assert data["keys"]["lora"] is None and data["keys"]["kv"] == fp.cache_key("kv")
    assert ModelFingerprint.from_dict(data) == fp
    # The single-file path form reads the same file and the JSON beside it.
    assert fingerprint(minilm_dir / "model.safetensors") == fp


def test_minilm_config_ignores_provenance_not_computation(minilm_copy: Path) -> None:
    before = fingerprint(minilm_copy)
    config_path = minilm_copy / "config.json"
    config = json.loads(config_path.read_text())
    config.update(
        _name_or_path="/somewhere/else",  # transformers_version: the tokenizer reads it
        use_cache=False,
        hidden_dropout_prob=0.3,
        attention_probs_dropout_prob=0.4,
        layer_norm_eps=1e-12,  # same value, written again
    )
    reordered = dict(sorted(config.items(), reverse=True))
    config_path.write_text(json.dumps(reordered, indent=7))
    after = fingerprint(minilm_copy)
    assert after == before
    assert all(after.compatible(before, kind) for kind in ("weights", "kv", "graph", "tokenizer"))

    config["hidden_act"] = "relu"  # same tensors, different computation
    config_path.write_text(json.dumps(config))
    changed = fingerprint(minilm_copy)
    assert changed.config != before.config
    assert (changed.graph, changed.weights) == (before.graph, before.weights)
    assert changed.compatible(before, "weights")
    assert changed.compatible(before, "tokenizer")
    assert not changed.compatible(before, "kv")
    assert not changed.compatible(before, "graph")
    assert not changed.compatible(before, "quant_weight")


def test_minilm_tokenizer_canonical_content(minilm_copy: Path) -> None:
    before = fingerprint(minilm_copy)
    tok = minilm_copy / "tokenizer.json"
    original = tok.read_text()
    tok.write_text(json.dumps(json.loads(original), indent=1))  # layout: not content
    assert fingerprint(minilm_copy).tokenizer == before.tokenizer
    # member order is content in the tokenizer id (6): transformers gives new special
    # tokens ids in file order; a false split for tokenizer.json, never a false share
    tok.write_text(json.dumps(dict(reversed(json.loads(original).items())), indent=1))
    assert fingerprint(minilm_copy).tokenizer != before.tokenizer
    tok.write_text(original)
    tok_config = minilm_copy / "tokenizer_config.json"
    obj = json.loads(tok_config.read_text())
    obj.update(name_or_path="/elsewhere", is_local=True, chat_template="{{ messages }}")
    tok_config.write_text(json.dumps(obj))
    assert fingerprint(minilm_copy).tokenizer == before.tokenizer

    vocab = minilm_copy / "vocab.txt"
    vocab.write_text(vocab.read_text().replace("[unused0]", "[brand-new]", 1))
    changed = fingerprint(minilm_copy)
    assert changed.tokenizer != before.tokenizer
    assert changed.compatible(before, "weights")
    assert not changed.compatible(before, "tokenizer")
    assert not changed.compatible(before, "kv_text")  # text-keyed K/V: tokenizer matters
    assert changed.compatible(before, "kv")  # K/V for given token ids do not change
    assert changed.compatible(before, "graph")  # tokenizer files are not the graph

    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (minilm_copy / name).unlink()
    (minilm_copy / "data_config.json").unlink()  # unknown files count for the tokenizer too
    bare = fingerprint(minilm_copy)
    assert bare.tokenizer is None
    with pytest.raises(CacheKindError, match="no tokenizer"):
        bare.cache_key("tokenizer")
    assert not bare.compatible(bare, "tokenizer")
    assert KEY.match(bare.cache_key("kv"))
    with pytest.raises(CacheKindError, match="no tokenizer"):
        bare.cache_key("kv_text")


def test_stamped_weights_come_from_headers_only(minilm_copy: Path) -> None:
    """A fresh stamp is trusted (no tensor byte read); a file written after it is hashed."""
    path = minilm_copy / "model.safetensors"
    hashed = fingerprint(minilm_copy)
    cmh.stamp(path)
    stamped = fingerprint(minilm_copy)
    assert stamped.hashed_files == () and stamped.untrusted_stamps == ()
    assert stamped.weights == hashed.weights  # the stamp claims the same identity

    overwrite_tensor_bytes(path, "embeddings.word_embeddings.weight")
    after = fingerprint(minilm_copy)  # another file version than the checked one: hashed
    assert after.hashed_files == ("model.safetensors",)
    assert "written since it was checked" in dict(after.untrusted_stamps)["model.safetensors"]
    assert after.weights == cmh.directory_identity(minilm_copy).hex != stamped.weights
    assert not cmh.verify(path).ok


def test_unstamped_shard_is_hashed(tmp_path: Path) -> None:
    state = tensors()
    model = write_model(tmp_path / "sharded", state, shards=2)
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    cmh.stamp(model / first)
    fp = fingerprint(model)
    assert fp.hashed_files == (second,)
    assert fp.weights == cmh.directory_identity(model).hex
    overwrite_tensor_bytes(model / second, "layers.1.attn.weight")
    changed = fingerprint(model)  # the unstamped shard is hashed, so the change shows
    assert changed.weights != fp.weights
    assert changed.graph == fp.graph


def test_sharded_and_unsharded_same_identity(tmp_path: Path) -> None:
    state = tensors()
    single = fingerprint(write_model(tmp_path / "one", state))
    for shards in (2, 3):
        directory = write_model(tmp_path / f"shards{shards}", state, shards=shards)
        sharded = fingerprint(directory)
        assert len([p for p in directory.glob("*.safetensors")]) == shards
        assert (sharded.weights, sharded.graph, sharded.config) == (
            single.weights,
            single.graph,
            single.config,
        )
        assert sharded.keys() == single.keys()
        assert sharded.graph == spec_graph(sorted(directory.glob("*.safetensors")))
        assert "model.safetensors.index.json" in sharded.files
    assert (single.arch, single.family, single.task) == ("toy", "ToyForCausalLM", "causal-lm")


def test_fine_tuned_copy_same_graph_new_weights(tmp_path: Path) -> None:
    state = tensors()
    base = fingerprint(write_model(tmp_path / "base", state))
    tuned_state = dict(state)
    tuned_state["layers.0.mlp.weight"] = state["layers.0.mlp.weight"] + np.float32(0.01)
    tuned = fingerprint(write_model(tmp_path / "tuned", tuned_state))
    assert tuned.graph == base.graph and tuned.config == base.config
    assert tuned.weights != base.weights and tuned.scope != base.scope
    assert tuned.compatible(base, "graph")
    assert not tuned.compatible(base, "weights")
    assert not tuned.compatible(base, "kv")
    assert not tuned.compatible(base, "quant_weight")
    # Same graph id, so the same key: a runtime keying by the whole string shares it.
    assert tuned.cache_key("graph") == base.cache_key("graph")
    assert tuned.cache_key("kv").split("/")[0] == tuned.scope != base.scope


def test_mapping_form_matches_directory(tmp_path: Path, minilm_dir: Path) -> None:
    """A store keeps blobs under content names: the mapping form reads them in place."""
    store = tmp_path / "blobs"
    store.mkdir()
    files = {}
    for path in minilm_dir.iterdir():
        if path.is_file():
            blob = store / hashlib.sha256(path.name.encode()).hexdigest()
            shutil.copyfile(path, blob)
            files[path.name] = str(blob)
    files["1_Pooling/config.json"] = str(minilm_dir / "1_Pooling" / "config.json")
    assert fingerprint_files(files) == fingerprint(minilm_dir)


# -- adapters ----------------------------------------------------------------------------


def test_adapter_own_weights_and_base_name(tmp_path: Path) -> None:
    base_dir = write_model(tmp_path / "base", tensors())
    adapter_dir = write_adapter(tmp_path / "adapter")
    fp = fingerprint(adapter_dir)
    base = fingerprint(base_dir)
    assert fp.is_adapter and fp.adapter_type == "LORA" and fp.base_model == "org/toy"
    assert fp.task == "causal-lm" and fp.arch is None
    assert fp.weights == cmh.directory_identity(adapter_dir).hex != base.weights
    assert fp.graph == spec_graph([adapter_dir / "adapter_model.safetensors"])
    assert KEY.match(fp.cache_key("lora")) and KEY.match(fp.cache_key("weights"))
    for kind in ("kv", "graph", "quant_weight"):
        with pytest.raises(CacheKindError, match="base model"):
            fp.cache_key(kind)
        assert not fp.compatible(base, kind)
    assert not base.compatible(fp, "lora")

    on_base = fingerprint(adapter_dir, base=base_dir)
    assert on_base == fp.with_base(base) == fingerprint(adapter_dir, base=base)
    assert (on_base.arch, on_base.family) == ("toy", "ToyForCausalLM")
    assert on_base.compatible(fp, "lora") and on_base.compatible(fp, "weights")
    assert not on_base.compatible(base, "kv")  # adapted model computes other KV values
    assert not on_base.compatible(base, "graph")
    assert on_base.compatible(base, "quant_weight")  # the quantized base is shared
    assert on_base.effective_tokenizer is None and base.tokenizer is None
    data = json.loads(json.dumps(on_base.to_dict()))
    assert data["base"]["weights"] == base.weights
    assert ModelFingerprint.from_dict(data) == on_base


def test_adapter_lora_key_covers_computation_only(tmp_path: Path) -> None:
    ref = fingerprint(write_adapter(tmp_path / "ref"))
    same = fingerprint(
        write_adapter(
            tmp_path / "same",
            target_modules=["mlp", "attn"],  # PEFT writes a set: order is noise
            lora_dropout=0.0,
            base_model_name_or_path="/local/copy/of/toy",
            peft_version="0.99",
        )
    )
    assert same.compatible(ref, "lora") and same.config == ref.config
    assert same.base_model == "/local/copy/of/toy"
    alpha = fingerprint(write_adapter(tmp_path / "alpha", lora_alpha=32))
    assert alpha.weights == ref.weights and not alpha.compatible(ref, "lora")
    other = fingerprint(write_adapter(tmp_path / "other", seed=1))
    assert other.graph == ref.graph and not other.compatible(ref, "lora")
    assert not other.compatible(ref, "weights")


def test_adapter_without_safetensors_is_refused(tmp_path: Path) -> None:
    adapter_dir = write_adapter(tmp_path / "adapter")
    (adapter_dir / "adapter_model.safetensors").rename(adapter_dir / "adapter_model.bin")
    with pytest.raises(NotAModelError, match=r"adapter_model\.safetensors"):
        fingerprint(adapter_dir)


# -- keys, JSON, canonical forms, errors ---------------------------------------------------


def test_key_kinds_and_variants(minilm_dir: Path) -> None:
    fp = fingerprint(minilm_dir)
    with pytest.raises(CacheKindError, match="unknown cache kind"):
        fp.cache_key("prefix")
    with pytest.raises(CacheKindError, match="unknown cache kind"):
        fp.compatible(fp, "prefix")
    int8 = fp.cache_key("quant_weight", variant="int8")
    assert KEY.match(int8) and int8 != fp.cache_key("quant_weight", variant="int4")
    assert not fp.compatible(fp, "lora")
    assert fp.compatible(fp, "quant_weight", variant="int8")
    with pytest.raises(CacheKindError, match="variant"):
        fp.cache_key("kv", variant="int8")
    with pytest.raises(CacheKindError, match="variant"):
        fp.compatible(fp, "kv", variant="int8")
    with pytest.raises(SemanticError, match="adapter fingerprints only"):
        fp.with_base(fp)
    assert set(fp.keys()) == set(CACHE_KINDS)


def test_from_dict_rejects_inconsistent_input(minilm_dir: Path) -> None:
    data = fingerprint(minilm_dir).to_dict()
    for key, value, message in [
        ("format", "cmh-semantic-v1", "format"),
        ("weights", "XYZ", "weights"),
        ("scope", "0" * 16, "scope"),
        ("tensor_count", -1, "tensor_count"),
        ("files", "model.safetensors", "files"),
        ("untrusted_stamps", ["model.safetensors"], "untrusted_stamps"),
        ("base", {"format": "cmh-semantic-v3"}, "graph"),
    ]:
        with pytest.raises(FingerprintFormatError, match=message):
            ModelFingerprint.from_dict({**data, key: value})
    keys = dict(data["keys"])
    keys["kv"] = keys["weights"]
    with pytest.raises(FingerprintFormatError, match="keys"):
        ModelFingerprint.from_dict({**data, "keys": keys})
    with pytest.raises(FingerprintFormatError):
        ModelFingerprint.from_dict([])  # type: ignore[arg-type]


def test_canonical_json_numbers_and_order() -> None:
    assert canonical_json({"b": 1.0, "a": [1e-7, 10000.0, "é"], "c": None}) == (
        '{"a":[1e-7,10000,"é"],"b":1,"c":null}'.encode()
    )
    # tokenizer_config.json's "no limit" is 1e30 as an integer: its nearest double.
    assert canonical_json({"n": 1000000000000000019884624838656}) == b'{"n":1e+30}'
    # never the strings "NaN", "Infinity": bare tokens, which no RFC 8785 text holds (4)
    assert canonical_json([float("nan"), float("inf"), "NaN"]) == b'[NaN,Infinity,"NaN"]'
    # Keys sort by UTF-16 code units (RFC 8785), not by code points.
    assert canonical_json({"\U0001f600": 1, "\uff61": 2}) == '{"😀":1,"｡":2}'.encode()


def test_config_dropped_fields_in_subconfigs(tmp_path: Path) -> None:
    state = tensors()
    a = write_model(tmp_path / "a", state)
    b = write_model(tmp_path / "b", state)
    sub = {"model_type": "toy_text", "hidden_size": 8, "_name_or_path": "x", "dropout": 0.1}
    quant = {"dropout": 0, "use_cache": 1}  # data, not fields: kept whole
    for directory, sub_extra, label in [(a, {}, quant), (b, {"_name_or_path": "y"}, quant)]:
        config = {**CONFIG, "text_config": {**sub, **sub_extra}, "quantization_config": label}
        (directory / "config.json").write_text(json.dumps(config))
    assert fingerprint(a).config == fingerprint(b).config
    config = {**CONFIG, "text_config": sub, "quantization_config": {"dropout": 0, "other": 1}}
    (b / "config.json").write_text(json.dumps(config))
    assert fingerprint(a).config != fingerprint(b).config


@pytest.mark.parametrize(
    ("family", "task"),
    [
        ("BertModel", "feature-extraction"),
        ("BertForMaskedLM", "masked-lm"),
        ("GPT2LMHeadModel", "causal-lm"),
        ("LlamaForCausalLM", "causal-lm"),
        ("T5ForConditionalGeneration", "conditional-generation"),
        ("BertForSequenceClassification", "sequence-classification"),
        ("Wav2Vec2ForCTC", "ctc"),
        ("InformerForPrediction", "prediction"),
        ("SomethingElse", None),
        (None, None),
    ],
)
def test_task_from_class(family: str | None, task: str | None) -> None:
    assert task_from_class(family) == task


def test_problem_type_is_not_a_task(tmp_path: Path) -> None:
    """``problem_type`` is not a task: the task stays; but it is no longer inert (spec 5:
    a text-classification pipeline applies softmax or sigmoid by it), so kv splits."""
    directory = write_model(tmp_path / "m", tensors())
    config = {**CONFIG, "architectures": ["ToyForSequenceClassification"]}
    (directory / "config.json").write_text(json.dumps(config))
    before = fingerprint(directory)
    assert before.task == "sequence-classification"
    config["problem_type"] = "single_label_classification"
    (directory / "config.json").write_text(json.dumps(config))
    after = fingerprint(directory)
    assert after.task == "sequence-classification"
    assert after.weights == before.weights and not after.compatible(before, "kv")


def test_bad_inputs_get_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(NotAModelError, match="no such file"):
        fingerprint(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(NotAModelError, match=r"no \*\.safetensors"):
        fingerprint(empty)
    with pytest.raises(NotAModelError, match=r"not a directory or a \.safetensors"):
        fingerprint(empty / "config.json")
    model = write_model(tmp_path / "m", tensors())
    (model / "config.json").write_text("{not json")
    with pytest.raises(NotAModelError, match=r"config\.json is not valid JSON"):
        fingerprint(model)
    (model / "config.json").write_text("[1, 2]")
    with pytest.raises(NotAModelError, match="JSON object"):
        fingerprint(model)
    sharded = write_model(tmp_path / "s", tensors(), shards=2)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(NotAModelError, match="missing shard"):
        fingerprint(sharded)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    index["weight_map"] = {"ghost": "model-00001-of-00002.safetensors"}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(NotAModelError, match="ghost") as info:
        fingerprint(sharded)
    assert isinstance(info.value.__cause__, cmh.InvalidFileError)
    with pytest.raises(SemanticError, match="adapter directories only"):
        fingerprint(model, base=model)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\x00" * 4)
    with pytest.raises(NotAModelError, match="too short"):
        fingerprint(model)


def test_spec_test_vectors(tmp_path: Path) -> None:
    """The vectors of spec/semantic.md, computed from the spec's formulas and by the library."""
    from cmh._header import TensorEntry
    from cmh.semantic._canonical import (
        TOKENIZER_DOMAIN,
        adapter_config_hash,
        config_hash,
        files_hash,
        kv_config_hash,
    )
    from cmh.semantic._model import key_id
    from cmh.semantic._tensors import graph_hash

    spec = (ROOT / "spec" / "semantic.md").read_text()

    def lp(data: bytes) -> bytes:
        return struct.pack("<I", len(data)) + data

    graph = hashlib.sha256(
        b"CMH-SEM-GRAPH-v1\n"
        + struct.pack("<Q", 2)
        + lp(b"a")
        + lp(b"F32")
        + struct.pack("<IQ", 1, 2)
        + lp(b"b")
        + lp(b"F16")
        + struct.pack("<I", 0)
    ).hexdigest()
    entries = [TensorEntry("b", "F16", (), 0, 2), TensorEntry("a", "F32", (2,), 2, 10)]
    assert graph_hash(entries) == graph and graph in spec

    reduced = (
        b'{"dtype":"bfloat16","eos_token_id":2,"hidden_size":8,"id2label":{"0":"A"},'
        b'"model_type":"llama","rope_parameters":{"rope_theta":10000,"rope_type":"default"}}'
    )
    config = hashlib.sha256(b"CMH-SEM-CONFIG-v3\n" + reduced).hexdigest()
    kv_config = hashlib.sha256(b"CMH-SEM-KV-CONFIG-v3\n" + reduced).hexdigest()  # eos kept
    source = {
        "model_type": "llama",
        "hidden_size": 8,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "_name_or_path": "x",
        "use_cache": True,
        "eos_token_id": 2,
        "id2label": {"0": "A"},
    }
    assert config_hash(source) == config and config in spec
    assert kv_config_hash(source) == kv_config and kv_config in spec
    # a model type not shown to read both RoPE spellings alike keeps its spelling
    toy = hashlib.sha256(
        b"CMH-SEM-CONFIG-v3\n"
        b'{"dtype":"bfloat16","eos_token_id":2,"hidden_size":8,"id2label":{"0":"A"},'
        b'"model_type":"toy","rope_theta":10000}'
    ).hexdigest()
    assert config_hash({**source, "model_type": "toy"}) == toy and toy in spec
    undtyped = tmp_path / "undtyped"  # no dtype in config.json: the load dtype (5)
    undtyped.mkdir()
    (undtyped / "config.json").write_text('{"model_type": "toy", "hidden_size": 8}')
    save_file(
        {"b": np.zeros(2, np.float32), "a": np.zeros(2, np.int64), "B": np.zeros(1, np.float16)},
        str(undtyped / "model.safetensors"),
    )
    loaded = hashlib.sha256(
        b'CMH-SEM-CONFIG-v3\n{"dtype":"float16","hidden_size":8,"model_type":"toy"}'
    ).hexdigest()
    assert fingerprint(undtyped).config == loaded and loaded in spec

    adapter_reduced = (
        b'{"init_lora_weights":"pissa","lora_alpha":16,"peft_type":"LORA",'
        b'"target_modules":["q_proj","v_proj"]}'
    )
    adapter = hashlib.sha256(b"CMH-SEM-ADAPTER-CONFIG-v3\n" + adapter_reduced).hexdigest()
    adapter_source = {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["v_proj", "q_proj"],
        "use_dora": False,
        "lora_dropout": 0.1,
        "init_lora_weights": "pissa",
    }
    assert adapter_config_hash(adapter_source) == adapter and adapter in spec
    ordered = hashlib.sha256(
        b"CMH-SEM-ADAPTER-CONFIG-v3\n"
        b'{"alpha_pattern":[["q_proj",64],["layers.0.self_attn.q_proj",2]],'
        b'"peft_type":"LORA","r":4}'
    ).hexdigest()
    pattern = {"q_proj": 64, "layers.0.self_attn.q_proj": 2}
    ordered_source = {"peft_type": "LORA", "r": 4, "alpha_pattern": pattern}
    assert adapter_config_hash(ordered_source) == ordered and ordered in spec

    (tmp_path / "vocab.txt").write_bytes(b"[PAD]\n")
    (tmp_path / "tokenizer_config.json").write_text(
        '{"name_or_path": "x", "model_max_length": 512, "do_lower_case": true}'
    )
    canonical_tc = b'{"model_max_length":512,"do_lower_case":true}'  # file order (6)
    tokenizer = hashlib.sha256(
        b"CMH-SEM-TOKENIZER-v3\n"
        + struct.pack("<I", 2)
        + lp(b"tokenizer_config.json")
        + struct.pack("<Q", len(canonical_tc))
        + canonical_tc
        + lp(b"vocab.txt")
        + struct.pack("<Q", 6)
        + b"[PAD]\n"
    ).hexdigest()
    files = [(n, str(tmp_path / n)) for n in ("vocab.txt", "tokenizer_config.json")]
    assert files_hash(TOKENIZER_DOMAIN, files, ordered=True) == tokenizer and tokenizer in spec

    kv = hashlib.sha256(
        b"CMH-SEM-KEY-v3\n" + lp(b"kv") + lp(b"a" * 64) + lp(b"") + lp(b"") + lp(b"") + lp(b"")
    ).hexdigest()
    assert key_id("kv", "a" * 64, "", "", "", "") == kv and kv in spec


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=6), _json_values, max_size=6), indent=st.integers(0, 4)
)
def test_canonical_json_ignores_layout(value: dict[str, object], indent: int) -> None:
    """Member order and whitespace never change the canonical bytes; values always do."""
    reordered = json.loads(json.dumps(dict(reversed(list(value.items()))), indent=indent))
    assert canonical_json(reordered) == canonical_json(value)
    assert canonical_json(json.loads(json.dumps(value))) == canonical_json(value)
    changed = {**value, "\x00extra": 1}
    assert canonical_json(changed) != canonical_json(value)


def test_stamped_and_unstamped_copies_compare_equal(tmp_path: Path) -> None:
    plain = write_model(tmp_path / "plain", tensors())
    stamped = write_model(tmp_path / "stamped", tensors())
    cmh.stamp(stamped / "model.safetensors")
    a, b = fingerprint(plain), fingerprint(stamped)
    assert (a.hashed_files, b.hashed_files) == (("model.safetensors",), ())
    assert a == b and a.keys() == b.keys()


def test_every_stamp_writer_leaves_a_trusted_stamp(tmp_path: Path) -> None:
    """cmh.stamp (first and in place) and cmh.save_file leave a check record (and the mtime
    at stamped_at); a clock running ahead does not matter, an edit does."""
    first = write_model(tmp_path / "first", tensors())
    path = first / "model.safetensors"
    record = cmh.stamp(path).record
    assert path.stat().st_mtime_ns == record.stamped_at * 1_000_000_000
    original = fingerprint(first)
    assert original.hashed_files == ()
    again = cmh.stamp(path, now=record.stamped_at - 5)
    assert again.in_place
    assert path.stat().st_mtime_ns == (record.stamped_at - 5) * 1_000_000_000
    assert fingerprint(first).hashed_files == ()
    cmh.stamp(path, now=time.time() + 3600)  # a clock an hour ahead: the stamper checked
    ahead = fingerprint(first)  # the bytes, so its record stands whatever the clock said
    assert ahead.hashed_files == ()
    with open(path, "r+b") as f:  # an edit inside that hour, mtime set back
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 1]))
    os.utime(path, ns=(path.stat().st_atime_ns, (record.stamped_at - 5) * 1_000_000_000))
    edited = fingerprint(first)
    assert edited.hashed_files == ("model.safetensors",)

    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps(CONFIG))
    cmh.save_file(tensors(), saved / "model.safetensors", {"format": "pt"}, ttl="30d")
    fp = fingerprint(saved)
    assert fp.hashed_files == () and fp.weights == original.weights


@pytest.mark.parametrize(
    "fields",
    [
        {"rope_parameters": {"rope_type": ["yarn"], "rope_theta": "x"}},
        {"rope_scaling": "linear", "rope_theta": [1]},
        {"rope_parameters": {"full": {"rope_theta": 1}}, "layer_types": 5},
        {"rope_parameters": {"full": {"rope_theta": 1}}, "layer_types": ["full"]},
        {"torch_dtype": {"nested": True}, "dtype": None},
        {"text_config": {"model_type": "t", "rope_scaling": {"type": 3}, "torch_dtype": 1}},
    ],
)
def test_odd_config_values_are_hashed_not_crashed_on(
    tmp_path: Path, fields: dict[str, object]
) -> None:
    """Normalization never fails on values of unexpected types: they are hashed as they are."""
    directory = write_model(tmp_path / "m", tensors())
    (directory / "config.json").write_text(json.dumps({**CONFIG, **fields}))
    fp = fingerprint(directory)
    assert fp.config is not None and fp.kv_config is not None
