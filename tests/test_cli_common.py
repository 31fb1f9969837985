"""The helpers every command module shares (cli/_common.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import pytest
from cli_support import run_runner, tensors
from click.testing import CliRunner
from cmh.cli import _common as common
from safetensors.numpy import save_file

import cmh
from cmh import (
    DurationError,
    InvalidFileError,
    NotStampedError,
    SigningKeyError,
    SizeError,
)


def test_exit_codes_are_the_documented_ones() -> None:
    assert (common.EXIT_OK, common.EXIT_CHECK_FAILED, common.EXIT_USAGE) == (0, 1, 2)
    assert common.EXIT_UNREADABLE == 3


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidFileError("bad header", "x.safetensors"), 3),
        (FileNotFoundError(2, "No such file or directory", "x"), 3),
        (SigningKeyError("x.key: not a PEM"), 2),
        (DurationError("invalid duration"), 2),
        (SizeError("invalid size"), 2),
        (NotStampedError("x: not stamped"), 1),
    ],
)
def test_handle_errors_maps_to_exit_codes(error: BaseException, code: int) -> None:
    @click.command()
    @common.handle_errors
    def command() -> None:
        raise error

    result = CliRunner().invoke(command, [])
    assert result.exit_code == code
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert result.stdout == ""
    if isinstance(error, OSError):
        assert result.stderr == "error: x: No such file or directory\n"


def test_keyboard_interrupt_exits_130() -> None:
    @click.command()
    @common.handle_errors
    def command() -> None:
        raise KeyboardInterrupt

    result = CliRunner().invoke(command, [])
    assert result.exit_code == 130 and result.stderr == "error: interrupted\n"


def _convert(param_type: click.ParamType, text: str) -> object:
    return param_type.convert(text, None, None)


def test_duration_and_size_types() -> None:
    assert _convert(common.DURATION, "1d12h") == 129600
    assert _convert(common.DURATION, "90") == 90
    assert _convert(common.TTL, "never") == common.NEVER
    assert _convert(common.TTL, "30d") == 30 * 86400
    assert _convert(common.SIZE, "1.5GiB") == 1610612736
    assert _convert(common.SIZE, "500M") == 500_000_000
    for param_type, text in ((common.DURATION, "never"), (common.DURATION, "5 parsecs")):
        with pytest.raises(click.BadParameter, match="invalid duration"):
            _convert(param_type, text)
    with pytest.raises(click.BadParameter, match="invalid size"):
        _convert(common.SIZE, "lots")


def test_time_type() -> None:
    assert _convert(common.TIME, "1767225600") == 1767225600.0
    assert _convert(common.TIME, "2026-01-01") == 1767225600.0
    assert _convert(common.TIME, "2026-01-01T01:00:00Z") == 1767229200.0
    assert _convert(common.TIME, "2026-01-01T03:00:00+02:00") == 1767229200.0
    before = time.time()
    ahead = _convert(common.TIME, "+2d")
    assert isinstance(ahead, float) and before + 2 * 86400 <= ahead <= time.time() + 2 * 86400
    behind = _convert(common.TIME, "-1h")
    assert isinstance(behind, float) and behind < before
    with pytest.raises(click.BadParameter, match="invalid time"):
        _convert(common.TIME, "next tuesday")
    assert _convert(common.TIME, "9999-12-31T23:59:59Z") == 253402300799.0
    for text in (
        "nan",
        "inf",
        "-inf",
        "1e300",
        "-1e300",
        "-99999999999",
        "-1",
        "+" + "9" * 400 + "w",
    ):
        with pytest.raises(click.BadParameter, match="is not a time from 1970-01-01T00:00:00Z"):
            _convert(common.TIME, text)


def test_huge_durations_and_sizes_are_refused_at_parse() -> None:
    """No ``OverflowError`` later: a float holds neither 400 digits of seconds nor of bytes."""
    with pytest.raises(click.BadParameter, match="longer than 10000 years"):
        _convert(common.DURATION, "9" * 400 + "w")
    with pytest.raises(click.BadParameter, match=r"invalid size .* too large"):
        _convert(common.SIZE, "9" * 400)


HUGE = "9" * 400  # no float holds it
BAD_VALUES = [
    (["verify", "FILE", "--at", "nan"], "--at", "'nan'"),
    (["verify", "FILE", "--at", "inf", "--json"], "--at", "'inf'"),
    (["prune", "--store", "DIR", "--dry-run", "--expired", "--at", "nan"], "--at", "'nan'"),
    (["prune", "--store", "DIR", "--dry-run", "--expired", "--at", "inf"], "--at", "'inf'"),
    (["prune", "--store", "DIR", "--dry-run", "--at", "-99999999999"], "--at", "-99999999999"),
    (["prune", "--store", "DIR", "--dry-run", "--settle", "nan"], "--settle", "'nan'"),
    (["prune", "--store", "DIR", "--dry-run", "--lock-timeout", "inf"], "--lock-timeout", "'inf'"),
    (["prune", "--store", "DIR", "--dry-run", "--older-than", HUGE + "w"], "--older-than", "99"),
    (["prune", "--store", "DIR", "--dry-run", "--max-size", HUGE], "--max-size", "99"),
    (["serve", "--store", "NONE", "--graceful-timeout", "nan"], "--graceful-timeout", "'nan'"),
    (["serve", "--store", "NONE", "--header-timeout", "inf"], "--header-timeout", "'inf'"),
    (["serve", "--store", "NONE", "--idle-timeout", "nan"], "--idle-timeout", "'nan'"),
    (["serve", "--store", "NONE", "--ref-ttl", "inf"], "--ref-ttl", "'inf'"),
    (["serve", "--store", "NONE", "--upstream", "http://[::1"], "--upstream", "'http://[::1'"),
    (["serve", "--store", "NONE", "--trust-origin", "http://[::1"], "--trust-origin", "http://[::1"),
    (["pull", "acme/x", "--endpoint", "http://[::1"], "--endpoint", "'http://[::1'"),
    (["pull", "acme/x", "--trust-origin", "http://[::1"], "--trust-origin", "'http://[::1'"),
    (["mirror", "sync", "acme/x", "--store", "DIR", "--from", "http://[::1"], "--from", "'http://[::1'"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "option", "value"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_values_no_command_can_use_are_usage_errors(
    tmp_path: Path, args: list[str], option: str, value: str
) -> None:
    """Non-finite or out-of-range numbers and times, unparsable URLs: exit 2, never a traceback."""
    file = tmp_path / "m.safetensors"
    save_file(tensors(1), str(file))
    cmh.stamp(file, ttl="30d")
    paths = {"FILE": str(file), "DIR": str(tmp_path), "NONE": str(tmp_path / "none")}
    given = [paths.get(a, a) for a in args]  # serve: a missing store, should a value pass
    run = run_runner(given)
    assert run.exit_code == 2, run.stderr
    assert run.stdout == "" and option in run.stderr and value in run.stderr, run.stderr


def test_emit_json_and_formatting() -> None:
    @click.command()
    def command() -> None:
        common.emit_json({"b": 1, "a": "é"})

    out = CliRunner().invoke(command, []).stdout
    assert json.loads(out) == {"a": "é", "b": 1} and out.index('"a"') < out.index('"b"')
    assert common.human_bytes(999) == "999 B"
    assert common.human_bytes(1536) == "1.5 kB"
    assert common.human_bytes(2 * 1024**3) == "2.1 GB"
    assert common.human_bytes(999_999) == "1.0 MB"
    assert common.iso_utc(0) == "1970-01-01T00:00:00Z"


def test_progress_bar_is_a_no_op_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with common.progress_bar(1 << 20, "hash") as advance:
        advance(1 << 19)
        advance(1 << 19)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    assert advance is common._no_progress


def test_sizes_have_their_own_error() -> None:
    from cmh import InputValueError, parse_duration, parse_size

    with pytest.raises(SizeError, match="invalid size") as caught:
        parse_size("12 parsecs")
    assert not isinstance(caught.value, DurationError)
    assert isinstance(caught.value, InputValueError)
    with pytest.raises(DurationError) as late:
        parse_duration("soon")
    assert not isinstance(late.value, SizeError)


@pytest.mark.parametrize("text", ["\u00b2", "\u00b2s"])
def test_a_duration_that_is_not_ascii_digits_is_a_duration_error(text: str) -> None:
    """``--fresh-for ²`` was a ValueError traceback ("²".isdigit() holds, int("²") raises)."""
    from cmh import parse_duration

    with pytest.raises(DurationError, match="invalid duration"):
        parse_duration(text)


def test_no_public_name_shadows_a_builtin() -> None:
    import builtins
    import importlib

    faces = ["cmh", "cmh.semantic", "cmh.hub", "cmh.hub.cache", "cmh.hub.resolver"]
    faces += ["cmh.hub.mirror", "cmh.hub.mirror.stores", "cmh.hub.mirror.web", "cmh.hub.prune"]
    # Every public name: the faces' surfaces (the errors among them), the CLI's module.
    names = {n for face in faces for n in importlib.import_module(face).__all__}
    names |= {n for n in vars(importlib.import_module("cmh.cli.main")) if not n.startswith("_")}
    assert not {n.rstrip("_") for n in names} & set(dir(builtins))
