"""Bounded, validating reader of the safetensors header (no tensor data read).

A safetensors file is ``u64le N``, then ``N`` bytes of UTF-8 JSON (an object,
possibly right-padded with spaces), then a byte buffer covered exactly by the
tensors' ``data_offsets``. :func:`read_header` checks every rule the format
sets and reports the first violation in plain words, as
:class:`~cmh._errors.InvalidFileError`. It never allocates by an untrusted
length: the header length is bounded by :data:`MAX_HEADER_SIZE` and by the
file size before anything is read.
"""

from __future__ import annotations

import json
import os
import re
import struct
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, BinaryIO

from ._errors import InvalidFileError
from ._regular import NotARegularFileError, open_regular

MAX_HEADER_SIZE = 100_000_000
#: Deepest nesting of arrays and objects in a header or an index (spec 2.2): ``{}`` is 1.
MAX_JSON_DEPTH = 64
#: Longest JSON number token in a header or an index, in characters (spec 2.2).
MAX_NUMBER_LENGTH = 100
PREFIX_SIZE = 8
METADATA_KEY = "__metadata__"
#: Largest value of a dimension or an offset: they are u64 in the fingerprint.
MAX_U64 = 2**64 - 1

#: Size in bits of one element of each dtype the format names.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

_TENSOR_FIELDS = frozenset({"dtype", "shape", "data_offsets"})


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's name, dtype and shape: what every description of one starts with."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TensorEntry(TensorSpec):
    """One tensor as the header describes it; offsets are relative to the buffer."""

    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def elements(self) -> int:
        """How many elements the tensor holds: ``product(shape)``, read from its byte size
        (which the header checked against the shape), so a shape with a dimension of 0
        beside huge ones costs nothing."""
        return 8 * self.nbytes // DTYPE_BITS[self.dtype]


@dataclass(frozen=True)
class Header:
    """A validated safetensors header.

    ``tensors`` is in manifest order: ascending ``(begin, end)``, ties (which
    only empty tensors can have) broken by UTF-8 name bytes. ``metadata`` is ``None`` when the file
    has no ``__metadata__`` entry.
    """

    header_size: int
    file_size: int
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str] | None
    raw: bytes = field(repr=False)

    @property
    def data_start(self) -> int:
        """Absolute file offset of the first byte of the tensor buffer."""
        return PREFIX_SIZE + self.header_size

    @property
    def data_size(self) -> int:
        return self.file_size - self.data_start

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and validate the header of the safetensors file at ``path``."""
    name = os.fspath(path)
    try:
        with open_regular(name) as f:
            return read_header_from(f, os.fstat(f.fileno()).st_size, path=name)
    except NotARegularFileError as exc:
        raise InvalidFileError(str(exc.strerror), name) from exc
    except OSError as exc:
        raise InvalidFileError(f"cannot read file: {exc.strerror or exc}", name) from exc


def read_header_from(f: BinaryIO, file_size: int, *, path: str | None = None) -> Header:
    """Validate the header read from the open binary file ``f`` of ``file_size`` bytes."""
    header_size = header_size_from_prefix(_read_exact(f, 0, PREFIX_SIZE, file_size, path), path)
    _check_header_size(header_size, file_size, path)
    raw = _read_exact(f, PREFIX_SIZE, header_size, file_size, path)
    return parse_header(raw, file_size, path=path)


def header_size_from_prefix(prefix: bytes, path: str | None = None) -> int:
    """Decode the u64 little-endian header length from the first 8 bytes."""
    if len(prefix) < PREFIX_SIZE:
        raise InvalidFileError(
            f"file is {len(prefix)} bytes long, too short to hold the 8-byte header length", path
        )
    (size,) = struct.unpack("<Q", prefix[:PREFIX_SIZE])
    return int(size)


#: First bytes of formats people take for safetensors, read as the u64 header length.
_OTHER_FORMATS = (
    (b"PK\x03\x04", "a zip archive: a PyTorch checkpoint (.bin/.pt/.pth saved by torch.save)"),
    (b"\x80\x02", "a Python pickle (an old PyTorch .bin)"),
    (b"GGUF", "a GGUF file (llama.cpp)"),
    (b"\x93NUMPY", "a NumPy .npy file"),
    (b"\x89HDF", "an HDF5 file (Keras .h5)"),
)


#: First bytes of text files people take for safetensors, and what they most likely are.
_TEXT_FORMATS = (
    (b"version ", "a Git LFS pointer: the weights were never downloaded (run `git lfs pull`)"),
    (b"<", "an HTML or XML page (a login or error page saved instead of the file?)"),
    (b"{", "a JSON file (a config or an index: give its directory instead)"),
    (b"[", "a JSON file"),
)


def _other_format(header_size: int) -> tuple[str, str] | None:
    """What a file is when its first bytes are another format's or text (``this is not a
    safetensors file, ...``) and what to do about it (``; ...`` or empty); None: no idea."""
    prefix = struct.pack("<Q", header_size)
    for magic, what in _OTHER_FORMATS:
        if prefix.startswith(magic[:PREFIX_SIZE]):
            hint = (
                "; convert it first, e.g. safetensors.torch.save_file(torch.load(path, "
                "weights_only=True), 'model.safetensors')"
                if "PyTorch" in what
                else ""
            )
            return f"this is not a safetensors file, it looks like {what}", hint
    return _text_hint(prefix)


def _text_hint(prefix: bytes) -> tuple[str, str] | None:
    """What a file whose first 8 bytes are printable text is (a safetensors file's never
    are: its header length would be over 100 MB)."""
    try:
        text = prefix.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not all(c.isprintable() or c in "\t\r\n" for c in text):
        return None
    stripped = prefix.lstrip()
    what = next((w for magic, w in _TEXT_FORMATS if stripped.startswith(magic)), "a text file")
    return (
        f"this is not a safetensors file, it starts with the text {text!r}: it looks like {what}",
        "",
    )


def _bad_length(header_size: int, problem: str) -> str:
    """What is wrong with the header length (``problem``: ``exceeds the ... limit``), after
    the diagnosis when the first bytes say what the file is: that is what a person acts on."""
    diagnosis = _other_format(header_size)
    if diagnosis is None:
        return f"header length {header_size} {problem}"
    what, hint = diagnosis
    return f"{what}; read as safetensors, its header length {header_size} {problem}{hint}"


def _check_header_size(header_size: int, file_size: int, path: str | None) -> None:
    if header_size > MAX_HEADER_SIZE:
        raise InvalidFileError(
            _bad_length(header_size, f"exceeds the {MAX_HEADER_SIZE}-byte limit"), path
        )
    if header_size < 2:
        raise InvalidFileError(f"header length {header_size} is too small for a JSON object", path)
    if PREFIX_SIZE + header_size > file_size:
        raise InvalidFileError(
            _bad_length(header_size, f"runs past the end of the file ({file_size} bytes)"), path
        )


def _read_exact(f: BinaryIO, offset: int, size: int, file_size: int, path: str | None) -> bytes:
    if offset + size > file_size:
        size = max(0, file_size - offset)
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise InvalidFileError("file changed or was truncated while it was read", path)
    return data


def parse_header(raw: bytes, file_size: int, *, path: str | None = None) -> Header:
    """Validate the ``N`` header bytes ``raw`` of a file of ``file_size`` bytes."""
    header_size = len(raw)
    _check_header_size(header_size, file_size, path)
    if not raw.startswith(b"{"):
        raise InvalidFileError("header does not start with '{'", path)
    text = strict_utf8(raw, "header", path)
    try:
        obj = _load_json(text, _parse_json_integer, float)
    except _DuplicateKeyError as exc:
        raise InvalidFileError(f"header has the key {exc.key!r} twice", path) from exc
    except _LoneSurrogateError as exc:
        raise InvalidFileError(
            f"header string {exc.text!r} holds an unpaired UTF-16 surrogate escape "
            "(not a Unicode scalar value)",
            path,
        ) from exc
    except ValueError as exc:
        raise InvalidFileError(f"header is not valid JSON: {exc}", path) from exc
    if not isinstance(obj, dict):
        raise InvalidFileError("header JSON is not an object", path)

    metadata = _parse_metadata(obj.pop(METADATA_KEY, _ABSENT), path)
    data_size = file_size - PREFIX_SIZE - header_size
    tensors = [_parse_tensor(name, info, path) for name, info in obj.items()]
    # Names hold no surrogate (checked above), so they encode; bytewise is the spec's order.
    tensors.sort(key=lambda t: (t.begin, t.end, t.name.encode("utf-8")))
    position = 0
    for t in tensors:
        if t.begin != position:
            gap_or_overlap = "a gap" if t.begin > position else "an overlap"
            raise InvalidFileError(
                f"tensor {t.name!r} starts at byte {t.begin} of the buffer but the previous "
                f"tensor ends at {position}: {gap_or_overlap} in data_offsets",
                path,
            )
        position = t.end
    if position != data_size:
        raise InvalidFileError(
            f"tensors cover {position} bytes but the buffer holds {data_size}: "
            "the buffer must be covered exactly",
            path,
        )
    return Header(
        header_size=header_size,
        file_size=file_size,
        tensors=tuple(tensors),
        metadata=metadata,
        raw=raw,
    )


def strict_utf8(raw: bytes, what: str, path: str | None) -> str:
    """``raw`` as UTF-8 text; :class:`InvalidFileError` naming ``what`` and the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidFileError(f"{what} is not valid UTF-8 (at byte {exc.start})", path) from exc


def parse_strict_json(text: str) -> Any:
    """One JSON value by the rules section 2.2-2.3 set for a header, whatever its shape.

    ``NaN``/``Infinity`` are rejected, no object may hold a key twice (compared
    after unescaping), and no string anywhere (keys, values, list items) may hold
    an unpaired surrogate escape. Raises ``ValueError`` saying which rule broke.
    """
    try:
        value = _load_json(text, JSONNumber, JSONNumber)
    except _DuplicateKeyError as exc:
        raise ValueError(f"the key {exc.key!r} appears twice in one object") from exc
    except _LoneSurrogateError as exc:
        raise ValueError(f"the string {exc.text!r} holds an unpaired surrogate escape") from exc
    _check_list_strings(value)
    return value


#: A JSON string (to skip over), or an unterminated one up to the end of the text (a
#: lone backslash last included): every quote outside a string then starts a match, so
#: the scan is one pass. Were an unterminated string no match, the scan would try again
#: from each quote inside it, each time to the end: quadratic (``{"`` then ``\\"``
#: repeated 40,000 times took 6 s). The JSON parser refuses such a text afterwards.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
#: A run of the characters a JSON number is made of.
_NUMBER_RUN = re.compile(rf"[-+.0-9eE]{{{MAX_NUMBER_LENGTH + 1},}}")
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def check_json_limits(text: str) -> None:
    """Spec 2.2's own limits, judged on the text before it is parsed (so no interpreter
    setting, stack depth or integer-digit limit changes a verdict): nesting at most
    :data:`MAX_JSON_DEPTH` deep, no number token over :data:`MAX_NUMBER_LENGTH` characters.
    Raises ``ValueError``."""
    outside_strings = _JSON_STRING.sub('""', text)
    if _NUMBER_RUN.search(outside_strings):
        raise ValueError(f"a number is longer than {MAX_NUMBER_LENGTH} characters")
    brackets = _NOT_A_BRACKET.sub("", outside_strings).encode("ascii")
    steps = array("b", brackets.translate(_DEPTH_STEP))
    if brackets and max(accumulate(steps)) > MAX_JSON_DEPTH:
        raise ValueError(f"arrays and objects are nested more than {MAX_JSON_DEPTH} deep")


class JSONNumber:
    """A number of an index kept as written: never converted, so neither its size nor its
    precision can fail (an index's ``metadata`` may hold ``1e400``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _load_json(
    text: str, parse_int: Callable[[str], Any], parse_float: Callable[[str], Any]
) -> Any:
    """The JSON value of ``text`` within the format's limits: no key twice, no unpaired
    surrogate in an object's keys or string values, no ``NaN``/``Infinity``."""
    check_json_limits(text)
    return json.loads(
        text,
        object_pairs_hook=_checked_object,
        parse_int=parse_int,
        parse_float=parse_float,
        parse_constant=_reject_constant,
    )


def _check_list_strings(value: Any) -> None:
    """Strings directly inside lists, which the object hook does not see."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for x in item:
                if isinstance(x, str):
                    try:
                        _check_scalar_values(x)
                    except _LoneSurrogateError as exc:
                        raise ValueError(
                            f"the string {exc.text!r} holds an unpaired surrogate escape"
                        ) from exc
                else:
                    stack.append(x)
        elif isinstance(item, dict):
            stack.extend(item.values())


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(key)


class _LoneSurrogateError(ValueError):
    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)


class _SignedInteger:
    """A JSON integer written with a sign (``-0``, ``-5``): never a count or an offset."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_ABSENT = object()


def _check_scalar_values(text: str) -> None:
    """Raise when ``text`` holds a surrogate (JSON lets ``\\ud800`` escape one alone)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _LoneSurrogateError(text) from exc


def _checked_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Build one JSON object: no key twice, no unpaired surrogate in a key or string value."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        _check_scalar_values(key)
        if isinstance(value, str):
            _check_scalar_values(value)
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _parse_json_integer(text: str) -> int | _SignedInteger:
    # json gives "-0" and "-5" as ints; the format allows no sign in a count or offset.
    return _SignedInteger(text) if text.startswith("-") else int(text)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parse_metadata(value: object, path: str | None) -> dict[str, str] | None:
    if value is _ABSENT:
        return None
    if not isinstance(value, Mapping):
        raise InvalidFileError("__metadata__ is not a JSON object", path)
    for key, item in value.items():
        if not isinstance(item, str):
            raise InvalidFileError(
                f"__metadata__ value of {key!r} is {type(item).__name__}, not a string", path
            )
    return dict(value)


def _is_count(value: object) -> bool:
    """A JSON integer without sign, fraction or exponent, at most 2^64-1."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_U64


def bounded_product(factors: Sequence[int], limit: int) -> int | None:
    """The product of ``factors`` (non-negative integers), or ``None`` when it is more than
    ``limit``. Linear in the number of factors: 0 when any factor is 0, else the product
    stops growing once it passes ``limit`` (no number larger than ``limit`` times a factor
    is ever made, so neither time nor an integer-digit limit depends on the factors)."""
    if 0 in factors:
        return 0
    product = 1
    for factor in factors:
        product *= factor
        if product > limit:
            return None
    return product


#: Longest list shown whole in a message; a longer one shows its first items and its length.
_BRIEF_ITEMS = 8


def _brief(value: object) -> str:
    """``value`` for a message, bounded: a long list shows its first items and its length,
    and any text past 200 characters is cut (a header may hold a list of a million items)."""
    if isinstance(value, list) and len(value) > _BRIEF_ITEMS:
        head = ", ".join(_brief(v) for v in value[:_BRIEF_ITEMS])
        text = f"[{head}, ... ({len(value)} items)]"
    else:
        text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}..."


def _parse_tensor(name: str, info: object, path: str | None) -> TensorEntry:
    if not isinstance(info, Mapping):
        raise InvalidFileError(f"entry for tensor {name!r} is not a JSON object", path)
    missing = _TENSOR_FIELDS - info.keys()
    if missing:
        raise InvalidFileError(f"tensor {name!r} lacks {', '.join(sorted(missing))}", path)
    extra = info.keys() - _TENSOR_FIELDS
    if extra:
        raise InvalidFileError(f"tensor {name!r} has unknown fields {sorted(extra)}", path)
    dtype = info["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise InvalidFileError(f"tensor {name!r} has unknown dtype {dtype!r}", path)
    shape = info["shape"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise InvalidFileError(
            f"tensor {name!r} has an invalid shape {_brief(shape)} (a list of integers from 0 "
            "to 2^64-1, without sign, fraction or exponent)",
            path,
        )
    offsets = info["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise InvalidFileError(
            f"tensor {name!r} has invalid data_offsets {_brief(offsets)} (two integers from 0 "
            "to 2^64-1, without sign, fraction or exponent, begin <= end)",
            path,
        )
    begin, end = int(offsets[0]), int(offsets[1])
    nbytes, bits_per_element = end - begin, DTYPE_BITS[dtype]
    # Spec 2.6 on numbers no larger than the offsets allow (2^64-1 elements at least, so
    # a small mismatch is named exactly): the product stops growing once it is past them,
    # and a shape of 200,000 dimensions of 2^64-1 is never multiplied out.
    elements = bounded_product(shape, max(8 * nbytes // bits_per_element, MAX_U64))
    if elements is None:
        raise InvalidFileError(
            f"tensor {name!r}: shape {_brief(shape)} of {dtype} holds more than 2^64-1 "
            f"elements but data_offsets span {nbytes} bytes",
            path,
        )
    bits = elements * bits_per_element
    if bits % 8:
        raise InvalidFileError(
            f"tensor {name!r}: shape {_brief(shape)} of {dtype} does not fill whole bytes", path
        )
    if bits // 8 != nbytes:
        raise InvalidFileError(
            f"tensor {name!r}: shape {_brief(shape)} of {dtype} needs {bits // 8} bytes but "
            f"data_offsets span {nbytes}",
            path,
        )
    return TensorEntry(
        name=name, dtype=dtype, shape=tuple(int(d) for d in shape), begin=begin, end=end
    )
