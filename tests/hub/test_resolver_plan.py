"""Partial-download planning and the multipart parser, without a server."""

from __future__ import annotations

import json

import cmh.hub as hub
import pytest
from click.testing import CliRunner
from cmh.cli.main import cli
from cmh.hub.mirror import add_folder
from cmh.hub.resolver._multipart import MultipartParser
from cmh.hub.resolver._partial import PatchNotPossible, _join_across_gaps, old_digests, plan_patch
from cmh.hub.resolver._types import HubProtocolError
from resolver_support import write_checkpoint_repo

from cmh import read_header


def test_coalesce_joins_smallest_gaps_within_allowance():
    ranges = [(0, 10), (12, 20), (100, 110), (111, 120)]
    assert _join_across_gaps(ranges, 3) == [(0, 20), (100, 120)]
    assert _join_across_gaps(ranges, 1) == [(0, 10), (12, 20), (100, 120)]
    assert _join_across_gaps(ranges, 0) == ranges


def test_plan_fetches_only_changed_tensors(tmp_path):
    old = write_checkpoint_repo(tmp_path / "v1", 1, changed=(2, 5)) / "model.safetensors"
    new = write_checkpoint_repo(tmp_path / "v2", 2, changed=(2, 5)) / "model.safetensors"
    old_header, old_sha = old_digests(old)
    new_header = read_header(new)
    prefix = new.read_bytes()[: new_header.data_start]
    plan = plan_patch(new_header, prefix, old_header, old_sha)
    changed = {t.name for t in new_header.tensors if t.name in ("layer.2.weight", "layer.5.weight")}
    by_name = new_header.by_name()
    wanted = sorted(
        (new_header.data_start + by_name[n].begin, new_header.data_start + by_name[n].end)
        for n in changed
    )
    assert plan.ranges == wanted
    assert plan.fetch_bytes == sum(e - b for b, e in wanted)
    assert plan.copied_bytes == new_header.data_size - plan.fetch_bytes
    names = [t.name for t in new_header.tensors]
    assert {names[i] for i in plan.trusted} == set(names) - changed


def test_plan_refuses_unstamped_new_version(tmp_path):
    old = write_checkpoint_repo(tmp_path / "v1", 1) / "model.safetensors"
    new = write_checkpoint_repo(tmp_path / "v2", 2, stamp=False) / "model.safetensors"
    header = read_header(new)
    with pytest.raises(PatchNotPossible):
        plan_patch(header, b"", *old_digests(old))


def test_multipart_parser_streams_parts_and_rejects_strays():
    got: list[tuple[int, bytes]] = []
    body = (
        b"\r\n--XX\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes 0-2/10\r\n\r\n"
        b"abc\r\n--XX\r\nContent-Range: bytes 7-9/10\r\n\r\nhij\r\n--XX--\r\n"
    )
    parser = MultipartParser(b"XX", {(0, 3), (7, 10)}, lambda o, d: got.append((o, d)))
    for i in range(0, len(body), 5):  # arrives in small pieces
        parser.feed(body[i : i + 5])
    parser.close()
    assert b"".join(d for o, d in got if o < 3) == b"abc"
    assert b"".join(d for o, d in got if o >= 7) == b"hij"
    stray = MultipartParser(b"XX", {(0, 3)}, lambda o, d: None)
    with pytest.raises(HubProtocolError):
        stray.feed(b"--XX\r\nContent-Range: bytes 4-6/10\r\n\r\nxyz\r\n--XX--\r\n")


def test_multipart_parser_takes_coalesced_adjacent_ranges_only_whole():
    got: list[tuple[int, bytes]] = []
    body = b"--XX\r\nContent-Range: bytes 2-7/10\r\n\r\ncdefgh\r\n--XX--\r\n"
    parser = MultipartParser(b"XX", {(2, 4), (4, 6), (6, 8)}, lambda o, d: got.append((o, d)))
    parser.feed(body)
    parser.close()
    assert got == [(2, b"cdefgh")]
    for part, wanted in (
        ("2-5", {(2, 4), (4, 8)}),  # ends inside an asked range
        ("2-7", {(2, 4), (5, 8)}),  # covers a byte not asked for
        ("3-7", {(2, 4), (4, 8)}),  # starts inside an asked range
    ):
        stray = MultipartParser(b"XX", wanted, lambda o, d: None)
        with pytest.raises(HubProtocolError):
            stray.feed(f"--XX\r\nContent-Range: bytes {part}/10\r\n\r\n".encode())


def test_pull_command(tmp_path, mirror_server_factory):
    store = tmp_path / "store"
    add_folder(store, write_checkpoint_repo(tmp_path / "v1", 1), "org/toy")
    server = mirror_server_factory(store)
    runner = CliRunner()
    args = ["pull", "org/toy", "--cache-dir", str(tmp_path / "cache"), "--endpoint", server.url]
    first = runner.invoke(cli, [*args, "--json"])
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert doc["command"] == "pull" and doc["state"] == hub.State.MISSING.value
    again = runner.invoke(cli, [*args, "--offline"])
    assert again.exit_code == 0 and again.stdout.strip() == doc["path"]
    missing = runner.invoke(cli, ["pull", "org/none", "--cache-dir", str(tmp_path), "--offline"])
    assert missing.exit_code == 3 and "not in the cache" in missing.stderr
    bad = runner.invoke(cli, ["pull", "bad//id", "--cache-dir", str(tmp_path)])
    assert bad.exit_code == 2
