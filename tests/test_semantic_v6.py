"""What a third reader written from spec/semantic.md alone found: each case is rebuilt
here from files made with code (a tiny ViT made with transformers where an output is
measured). A false share is shown with the stock loader, then the keys must differ; a
bound the reference took from the Python process is shown to be the spec's own.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_semantic_cache_keys import max_diff

from cmh.semantic import NotAModelError, canonical_json, fingerprint
from cmh.semantic._files import group_files


def _weights(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)


def _model(d: Path, files: dict[str, bytes | str]) -> Path:
    """A model directory: one weight file, a config.json and ``files``."""
    d.mkdir(parents=True)
    _weights(d / "model.safetensors")
    (d / "config.json").write_text('{"model_type": "toy", "dtype": "float32"}')
    for name, content in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        (d / name).write_bytes(data)
    return d


# -- S5: a path fast_tokenizer_files names keeps the groups of its own rule (1.2) ----------


def test_a_listed_fast_tokenizer_file_keeps_its_own_groups() -> None:
    """Rule 5 placed every path fast_tokenizer_files names as tokenizer-only, before rule 6
    could make preprocessor_config.json a processor file."""
    listed = ["preprocessor_config.json", "notes.txt", "quantize_config.json"]
    paths = ["tokenizer_config.json", *listed]
    groups = group_files(paths, fast_tokenizer_files=listed)
    assert set(groups.tokenizer) == set(paths)
    assert set(groups.processor) == set(listed)
    assert groups.quant == ("quantize_config.json",)


def _vit_with_mean(d: Path, mean: float) -> Path:
    import torch
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32,
    )  # fmt: skip
    ViTModel(config).save_pretrained(d)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[mean] * 3).save_pretrained(d)
    listing = {"fast_tokenizer_files": ["preprocessor_config.json"]}
    (d / "tokenizer_config.json").write_text(json.dumps(listing))
    return d


@pytest.mark.heavy
def test_an_image_processor_named_by_fast_tokenizer_files_splits_kv_and_graph(
    tmp_path: Path,
) -> None:
    """tokenizer_config.json listing preprocessor_config.json in fast_tokenizer_files took
    the file out of the processor group: two image normalizations, other hidden states,
    one kv and one graph key."""
    import numpy as np
    import torch
    from transformers import AutoImageProcessor, AutoModel

    dirs = [_vit_with_mean(tmp_path / name, mean) for name, mean in (("a", 0.5), ("b", 0.1))]
    image = (np.random.default_rng(0).random((8, 8, 3)) * 255).astype(np.uint8)
    states = []
    for d in dirs:
        processor: Any = AutoImageProcessor.from_pretrained(d)
        with torch.no_grad():
            model: Any = AutoModel.from_pretrained(d).eval()
            states.append(model(**processor(image, return_tensors="pt")).last_hidden_state)
    assert max_diff(states[0], states[1]) > 0.01  # the stock loader reads the file
    a, b = (fingerprint(d) for d in dirs)
    assert a.processor is not None and a.processor != b.processor
    for kind in ("kv", "graph", "kv_text"):
        assert a.cache_key(kind) != b.cache_key(kind), kind


# -- S1, S2: the bounds of a JSON file are the spec's, not the process's (4) ----------------


@pytest.fixture
def int_digits_bound() -> Iterator[Callable[[int], None]]:
    """Set the process's bound on int/str conversions (PYTHONINTMAXSTRDIGITS) for a test."""
    before = sys.get_int_max_str_digits()
    yield sys.set_int_max_str_digits
    sys.set_int_max_str_digits(before)


@pytest.mark.parametrize("process_bound", [0, 640, 4300])
def test_an_integer_of_4300_digits_is_read_and_one_more_is_an_error_in_every_process(
    tmp_path: Path, int_digits_bound: Callable[[int], None], process_bound: int
) -> None:
    """4300 digits is the spec's bound: a 4301-digit integer was read with
    PYTHONINTMAXSTRDIGITS=0, and a 700-digit one refused under 640."""
    int_digits_bound(process_bound)
    longest = "9" * 4300
    mid = "7" * 700
    d = _model(tmp_path / "ok", {"tokenizer.json": f'{{"big": -{longest}, "mid": {mid}}}'})
    spaced = _model(
        tmp_path / "spaced", {"tokenizer.json": f'{{ "big" : -{longest} , "mid" : {mid} }}'}
    )
    assert fingerprint(d).tokenizer == fingerprint(spaced).tokenizer is not None
    bad = _model(tmp_path / "bad", {"tokenizer.json": f'{{"big": {longest}9}}'})
    with pytest.raises(NotAModelError, match="4301 digits"):
        fingerprint(bad)
    int_digits_bound(0)  # the canonical form itself, exactly
    assert canonical_json(-int(longest)) == f"-{longest}n".encode()


def test_the_integer_form_is_the_same_whatever_the_process_bound(
    int_digits_bound: Callable[[int], None],
) -> None:
    value = 3**2000  # 955 digits, no double
    int_digits_bound(0)
    expected = str(value).encode() + b"n"
    assert canonical_json(value) == expected
    int_digits_bound(640)  # str() of it fails in such a process
    assert canonical_json(value) == expected


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _at_stack_depth(frames: int, call: Callable[[], Any]) -> Any:
    return call() if frames == 0 else _at_stack_depth(frames - 1, call)


@pytest.mark.parametrize("stack", [0, 300])
def test_256_nested_arrays_are_read_and_257_are_an_error_at_any_stack_depth(
    tmp_path: Path, stack: int
) -> None:
    """Python's parser gave up at a depth that moved with the caller's stack (900 read,
    990 refused from the CLI); 256 is the spec's bound (4) for every reader."""
    ok = _model(tmp_path / "ok", {"tokenizer.json": _nested(256)})
    assert _at_stack_depth(stack, lambda: fingerprint(ok)).tokenizer is not None
    for depth in (257, 990, 100_000):
        deep = _model(tmp_path / f"deep{depth}", {"tokenizer.json": _nested(depth)})
        with pytest.raises(NotAModelError, match="nested more than 256"):
            _at_stack_depth(stack, lambda deep=deep: fingerprint(deep))


# -- S3, S4: what 4 and 6 now say outright --------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", '{"a": 1,}', "{not json}", '{"a": "x\u0001y"}', '{"a": nan}', "\f{}", "{} {}"]
)
def test_a_json_file_of_a_group_that_is_not_json_is_an_error(tmp_path: Path, text: str) -> None:
    d = _model(tmp_path / "m", {"notes.json": text})  # an unknown top-level file: rule 6
    with pytest.raises(NotAModelError, match=r"notes\.json"):
        fingerprint(d)


def test_a_json_file_that_is_only_a_data_file_is_bytes(tmp_path: Path) -> None:
    """Beside code, an inert trainer_state.json is a data file of code alone: its bytes."""
    d = _model(tmp_path / "m", {"modeling_x.py": "", "trainer_state.json": "{not json"})
    assert "trainer_state.json" in fingerprint(d).files


def test_the_tokenizer_config_drops_are_for_the_top_level_file_only(tmp_path: Path) -> None:
    """sub/tokenizer_config.json (an unknown file in a subfolder) is hashed whole."""
    a = _model(tmp_path / "a", {"sub/tokenizer_config.json": '{"name_or_path": "a"}'})
    b = _model(tmp_path / "b", {"sub/tokenizer_config.json": '{"name_or_path": "b"}'})
    assert fingerprint(a).tokenizer != fingerprint(b).tokenizer
    c = _model(tmp_path / "c", {"tokenizer_config.json": '{"name_or_path": "a"}'})
    e = _model(tmp_path / "e", {"tokenizer_config.json": '{"name_or_path": "b"}'})
    assert fingerprint(c).tokenizer == fingerprint(e).tokenizer
