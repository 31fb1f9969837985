"""Helpers for tests over real object storages (SeaweedFS and moto, both started by the
tests): the AWS settings of one, a store opened on it, and a ref's whole history."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import pytest
from cmh.hub.mirror.stores.bucket._bucket import BucketStore


class Bucket(Protocol):
    """What ``seaweed_bucket``, ``moto_bucket`` and ``no_cas_bucket`` have in common."""

    @property
    def url(self) -> str: ...

    def aws_env(self) -> dict[str, str]: ...


def isolated_aws_env(bucket: Bucket, folder: Path) -> dict[str, str]:
    """The AWS settings that reach ``bucket`` and nothing else: no profile files (named
    in ``folder``, never made), no instance role."""
    return {
        **bucket.aws_env(),
        "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def use_bucket(bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point this process's standard AWS settings at ``bucket`` (no profile files); the
    settings, for subprocesses."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    env = isolated_aws_env(bucket, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def open_store(bucket: Bucket, **options: Any) -> BucketStore:
    return BucketStore.open(bucket.url, **options)


def history(
    store: BucketStore, folder: str, revision: str = "main", *, pruned: bool = False
) -> list[str]:
    """Every commit from the ref back to the root, newest first (with ``pruned``, back to
    the first whose parent's tree object a prune removed)."""
    ref = store.read_ref(folder, revision)
    out: list[str] = []
    commit = ref.commit if ref is not None else ""
    while commit:
        tree = store.read_tree(folder, commit)
        if tree is None and pruned and out:
            break
        out.append(commit)
        assert tree is not None, f"{commit} in the history of {revision} has no tree object"
        commit = tree.parents[0] if tree.parents else ""
    return out
