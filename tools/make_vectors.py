"""Write the CMH v1 test vectors in tests/fixtures/vectors/ (spec section 10).

Deterministic: fixed tensors, fixed times, a fixed Ed25519 seed. Each
``NAME.safetensors`` gets ``NAME.json`` with what a reader must find.
Run: ``python tools/make_vectors.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.numpy import save_file

import cmh
from cmh.digests import hash_tensors

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vectors"
STAMPED_AT = 1_767_225_600  # 2026-01-01T00:00:00Z
SIGNING_SEED = bytes(range(32))


def grid(shape: tuple[int, ...], dtype: type, offset: int = 0) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) + offset).reshape(shape).astype(dtype)


def cases() -> dict[str, tuple[dict[str, np.ndarray], dict[str, str] | None, dict[str, object]]]:
    many = {f"t{i:05d}": np.array([i], dtype=np.int32) for i in range(10_000)}
    f8 = np.frombuffer(bytes(range(16)), dtype=np.uint8)
    return {
        "basic": (
            {"weight": grid((2, 3), np.float32), "bias": grid((3,), np.float16, 7)},
            {"format": "pt", "note": "basic"},
            {"ttl": 30 * 86400},
        ),
        "no-metadata": ({"x": grid((4,), np.int64)}, None, {}),
        "empty-and-scalar": (
            {
                "empty": np.zeros((0, 5), np.float32),
                "also-empty": np.zeros((3, 0), np.int8),
                "scalar": np.array(2.5, np.float64),
            },
            {"format": "np"},
            {},
        ),
        "non-ascii-names": (
            {
                "poids.é": grid((2,), np.float32),
                "重み": grid((2,), np.float32, 2),
                "Ω": grid((1,), np.uint8),
            },
            {"clé": "valeur ✓"},
            {},
        ),
        "one-tensor": ({"only": grid((8,), np.uint8)}, {"format": "pt"}, {"xxh3": False}),
        "many-tensors": (many, {"format": "pt"}, {}),
        "bool-and-f8": (
            {"mask": np.array([True, False, True]), "f8": f8},
            {"format": "pt"},
            {"f8": True},
        ),
        "signed": ({"w": grid((4, 4), np.float32)}, {"format": "pt"}, {"sign": True, "ttl": 86400}),
        "expired": ({"w": grid((2,), np.float32)}, None, {"ttl": 60}),
        "no-tensors": ({}, {"format": "pt"}, {}),
    }


def retype_f8(path: Path) -> None:
    """Relabel the U8 tensor ``f8`` as F8_E4M3 (numpy has no 8-bit float)."""
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["f8"]["dtype"] = "F8_E4M3"
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def describe(path: Path, options: dict[str, object]) -> dict[str, object]:
    header = cmh.read_header(path)
    info = cmh.inspect(path)
    record = info.record
    assert record is not None
    digests = hash_tensors(path, header, xxh3=True)
    return {
        "file": path.name,
        "stamped_at": record.stamped_at,
        "expires_at": record.expires_at,
        "expected_outcome_at_stamped_at": "ok",
        "record_hex": record.to_hex(),
        "record": {
            "magic": "434d4800",
            "version": record.version,
            "expires_at": record.expires_at,
            "fingerprint": record.fingerprint.hex(),
            "flags": record.flags,
            "stamped_at": record.stamped_at,
        },
        "root": record.fingerprint.hex(),
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "data_offsets": [t.begin, t.end],
                "sha256": d.sha256.hex() if d.sha256 else None,
                "xxh3_128": d.xxh3.hex() if d.xxh3 else None,
            }
            for i, (t, d) in enumerate(zip(header.tensors, digests, strict=True))
            # Large vectors list their first and last tensors only; the root covers all.
            if len(header.tensors) <= 100 or i in (0, len(header.tensors) - 1)
        ],
        "tensor_count": len(header.tensors),
        "metadata_covered": info.metadata,
        "signed_by_key_id": info.signer_key_id,
        "has_xxh3_manifest": info.has_xxh3_manifest,
        "options": options,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    write_vectors(out)
    print(f"wrote {len(list(out.rglob('*')))} files to {out}")
    return 0


def write_vectors(out: Path) -> None:
    """Write every vector into ``out`` (emptied first)."""
    global OUT
    OUT = out
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    key = Ed25519PrivateKey.from_private_bytes(SIGNING_SEED)
    (OUT / "signing-key.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for name, (tensors, metadata, options) in cases().items():
        path = OUT / f"{name}.safetensors"
        save_file(tensors, str(path), metadata)
        if options.get("f8"):
            retype_f8(path)
        cmh.stamp(
            path,
            ttl=options.get("ttl"),  # type: ignore[arg-type]
            now=STAMPED_AT,
            xxh3=bool(options.get("xxh3", True)),
            sign_key=key if options.get("sign") else None,
        )
        (OUT / f"{name}.json").write_text(
            json.dumps(describe(path, options), indent=1, ensure_ascii=False) + "\n"
        )

    # A two-shard checkpoint and the same tensors in one file share an identity.
    sharded = OUT / "sharded"
    sharded.mkdir()
    tensors = {f"layer.{i}.weight": grid((4, 4), np.float32, i) for i in range(4)}
    first = {k: tensors[k] for k in list(tensors)[:2]}
    second = {k: tensors[k] for k in list(tensors)[2:]}
    save_file(first, str(sharded / "model-00001-of-00002.safetensors"), {"format": "pt"})
    save_file(second, str(sharded / "model-00002-of-00002.safetensors"), {"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in second})
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 256}, "weight_map": weight_map}, indent=1) + "\n"
    )
    for shard in sorted(sharded.glob("*.safetensors")):
        cmh.stamp(shard, now=STAMPED_AT)
    single = OUT / "unsharded.safetensors"
    save_file(tensors, str(single), {"format": "pt"})
    identity = cmh.directory_identity(sharded).hex
    assert cmh.fingerprint(single).hex != identity  # a file root is not a directory identity
    single_dir = OUT / "unsharded-dir"
    single_dir.mkdir()
    shutil.move(str(single), single_dir / "model.safetensors")
    assert cmh.directory_identity(single_dir).hex == identity
    (OUT / "sharded.json").write_text(
        json.dumps(
            {"directory": "sharded", "same_identity_as": "unsharded-dir", "identity": identity},
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
