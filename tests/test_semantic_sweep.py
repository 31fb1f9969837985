"""Issue 25 property sweep: over every model type of transformers' own auto-mapping, a
change of any config field not argued inert changes the ``kv`` id, and a one-byte change
of any file not argued inert changes the ``kv`` or ``tokenizer`` key.

Config level only (no model is instantiated), so the sweep stays bounded: each
config class is built with its defaults, written as transformers writes it, and
each field (top level and in sub-configs) is perturbed in turn.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from cmh.semantic import CONFIG_DROPPED, fingerprint
from cmh.semantic._canonical import kv_config_hash
from cmh.semantic._files import is_inert

pytestmark = pytest.mark.heavy


def _configs() -> dict[str, dict[str, Any]]:
    """``model_type`` -> the dict its config class writes with default values."""
    import warnings

    from transformers import CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    out: dict[str, dict[str, Any]] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                config = CONFIG_MAPPING[model_type]()
                out[model_type] = json.loads(config.to_json_string(use_diff=False))
            except Exception:  # a config that needs arguments or an optional package
                continue
    return out


@pytest.fixture(scope="module")
def configs() -> dict[str, dict[str, Any]]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    out = _configs()
    assert len(out) > 0.8 * len(CONFIG_MAPPING_NAMES)  # nearly every type was swept
    return out


def _perturbed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, 1]
    if isinstance(value, dict):
        return {**value, "_sweep": 1}
    return 1  # None


def _paths(config: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field path: top-level members, and the members of sub-configs."""
    out: list[tuple[str, ...]] = []
    for key, value in config.items():
        if key in CONFIG_DROPPED:
            continue
        if key == "torch_dtype" and config.get("dtype") is not None:
            continue  # transformers 5 reads dtype when both are set (spec 5, normalization)
        out.append((*prefix, key))
        if isinstance(value, dict) and "model_type" in value:
            out.extend(_paths(value, (*prefix, key)))
    return out


def _with(config: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    copy = json.loads(json.dumps(config))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _perturbed(target[path[-1]])
    return copy


def test_every_config_field_of_every_model_type_is_in_kv(
    configs: dict[str, dict[str, Any]],
) -> None:
    checked = 0
    shared: list[str] = []
    for model_type, config in sorted(configs.items()):
        base = kv_config_hash(config)
        for path in _paths(config):
            checked += 1
            if kv_config_hash(_with(config, path)) == base:
                shared.append(f"{model_type}: {'.'.join(path)}")
    assert checked > 10_000
    assert shared == []


def _tiny_safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)


FILES: dict[str, bytes] = {
    "tokenizer_config.json": b'{"tokenizer_class": "BertTokenizer", "do_lower_case": true}',
    "tokenizer.json": b'{"model": {"vocab": {"a": 0}}}',
    "special_tokens_map.json": b'{"unk_token": "[UNK]"}',
    "vocab.txt": b"[PAD]\n[UNK]\n",
    "tekken.json": b'{"vocab": []}',
    "tokenizer.model.v3": b"spm-bytes",
    "preprocessor_config.json": b'{"size": 224}',
    "processor_config.json": b'{"processor_class": "X"}',
    "feature_extractor_config.json": b'{"n_fft": 400}',
    "a_file_of_a_future_release.json": b'{"x": 1}',
    "data.bin": b"opaque",
    "modeling_x.py": b"X = 1\n",
    "nested/code/helper.py": b"Y = 2\n",
    "assets/logo.png": b"png",
    "logo.png": b"png",
}


def _flip_one_byte(content: bytes) -> bytes:
    """Change one byte and keep JSON valid: a digit or letter inside the text."""
    for i, byte in enumerate(content):
        if chr(byte).isalnum():
            replacement = b"9" if chr(byte) != "9" else b"8"
            return content[:i] + replacement + content[i + 1 :]
    raise AssertionError("no byte to change")


def test_one_byte_in_any_non_inert_file_changes_a_key(
    configs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """Every model type of the auto-mapping: files not argued inert, one byte changed,
    change the kv or the tokenizer key; argued-inert files change no key. To bound the
    runtime each type changes three of the files, in rotation (every file is changed
    under about a fifth of the types), and a few common types change all of them."""
    directory = tmp_path / "m"
    directory.mkdir()
    _tiny_safetensors(directory / "model.safetensors")
    for name, content in FILES.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    assert not any(is_inert(name) for name in FILES)
    shared: list[str] = []
    names = list(FILES)
    for i, (model_type, config) in enumerate(sorted(configs.items())):
        (directory / "config.json").write_text(json.dumps(config))
        base = fingerprint(directory)
        every = model_type in ("bert", "llama", "qwen2", "mistral", "t5", "whisper", "qwen4_exp")
        chosen = names if every else [names[(i + k) % len(names)] for k in (0, 5, 9)]
        for name in chosen:
            content = FILES[name]
            (directory / name).write_bytes(_flip_one_byte(content))
            after = fingerprint(directory)
            (directory / name).write_bytes(content)
            if after.compatible(base, "kv") and after.compatible(base, "tokenizer"):
                shared.append(f"{model_type}: {name}")
    assert shared == []
    with_code = fingerprint(directory)
    (directory / "README.md").write_bytes(b"read by the code")
    changed = fingerprint(directory)
    for kind in ("kv", "graph", "quant_weight"):  # code may open any file: nothing is inert
        assert not changed.compatible(with_code, kind), kind
    for name in ("modeling_x.py", "nested/code/helper.py"):
        (directory / name).unlink()
    for name in ("README.md", ".gitattributes", "LICENSE", "trainer_state.json"):
        (directory / name).write_bytes(b"one")
        first = fingerprint(directory)
        (directory / name).write_bytes(b"two")
        assert fingerprint(directory).keys() == first.keys(), name  # on the exact inert list
    (directory / "generation_config.json").write_bytes(b'{"max_new_tokens": 1}')
    first = fingerprint(directory)
    (directory / "generation_config.json").write_bytes(b'{"max_new_tokens": 2}')
    second = fingerprint(directory)
    first_keys, second_keys = first.keys(), second.keys()
    assert [k for k in first_keys if first_keys[k] != second_keys[k]] == ["generation"]
