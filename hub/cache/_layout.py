"""The stock Hugging Face cache layout, shared by the mirror store and the resolver.

``{root}/{models|datasets|spaces}--{org}--{name}/`` holds ``blobs/{etag}``,
``snapshots/{commit}/{path}`` (relative symlinks to ``../../blobs/{etag}``),
``refs/{revision}`` (the commit as text), ``.no_exist/{commit}/{path}`` and
``trees/{commit}.json``. Keeping this layout is what lets stock tools read what
cmh writes and the other way round. cmh's own bookkeeping lives in
``{repo}/.cmh/``, which the stock cache scanner ignores.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cmh import atomic_symlink, atomic_write, read_small_file

REPO_TYPE_PREFIX = {"model": "models", "dataset": "datasets", "space": "spaces"}
PREFIX_REPO_TYPE = {v: k for k, v in REPO_TYPE_PREFIX.items()}
COMMIT_RE = re.compile(r"^[0-9a-f]{40}\Z")
#: A blob name (ETag): the git blob SHA-1 of a regular file, the SHA-256 of an LFS file.
ETAG_PATTERN = r"[0-9a-f]{40}|[0-9a-f]{64}"
ETAG_RE = re.compile(rf"^(?:{ETAG_PATTERN})\Z")
#: One part of a repo id (``org`` or ``name``).
REPO_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class LayoutError(ValueError):
    """A repo id, revision or path that cannot name anything inside a store."""


def validate_repo_id(repo_id: str) -> str:
    """Accept ``name`` or ``org/name`` made of letters, digits, ``.``, ``_``, ``-``."""
    parts = repo_id.split("/")
    if not 1 <= len(parts) <= 2 or not all(
        REPO_PART_RE.match(p) and ".." not in p and "--" not in p and len(p) <= 96 for p in parts
    ):
        raise LayoutError(f"invalid repo id {repo_id!r}: {_repo_id_hint(repo_id)}")
    return repo_id


def _repo_id_hint(repo_id: str) -> str:
    """What was probably meant, for the message of an invalid repo id."""
    expected = "expected NAME or ORG/NAME (letters, digits, '.', '_', '-'), e.g. acme/bert-tiny"
    text = repo_id.strip()
    if "://" in text:
        path = text.split("://", 1)[1].partition("/")[2].strip("/")
        parts = path.split("/")
        kind = ""
        if parts and parts[0] in ("datasets", "spaces"):
            kind, parts = parts[0], parts[1:]
        guess = "/".join(parts[:2])
        if guess:
            flag = f" with --repo-type {kind[:-1]}" if kind else ""
            return f"give the repo id, not a URL: {guess!r}{flag}"
        return f"give the repo id, not a URL; {expected}"
    for kind in ("datasets", "spaces", "models"):
        if text.startswith(kind + "/") and text.count("/") == 2:
            rest = text.split("/", 1)[1]
            if kind == "models":
                return f"drop the prefix: {rest!r}"
            return f"give {rest!r} with --repo-type {kind[:-1]}"
    return expected


#: A ref file larger than this is not read (it names no commit), in a folder as in a bucket.
MAX_REF_BYTES = 4 << 10
_REF_SPACE = b" \t\n\r\x0b\x0c"


def parse_ref(data: bytes) -> str | None:
    """The commit a ref file's bytes name: 40 lowercase hex, with any ASCII whitespace
    before or after it ignored (cmh writes a folder's ref bare, a bucket's with ``\n``;
    other tools may add a newline); ``None`` for anything else, or more than
    :data:`MAX_REF_BYTES` bytes."""
    if len(data) > MAX_REF_BYTES:
        return None
    text = data.strip(_REF_SPACE)
    return text.decode("ascii") if re.fullmatch(rb"[0-9a-f]{40}", text) else None


def validate_revision(revision: str) -> str:
    """A branch, tag, ``refs/pr/N`` or commit: no empty, dot-dot or absolute parts."""
    return _slash_path(revision, "revision", 256, "\\\x00\n\r")


def validate_relpath(path: str) -> str:
    """A file path inside a repo: relative, ``/``-separated, no ``..``, backslash, or control
    character (``U+0000``-``U+001F``, ``U+007F``: the mirror refuses to serve such a path,
    so an import refuses it, naming it, before it writes anything)."""
    control = _CONTROL.search(path)
    if control is not None:
        code = f"U+{ord(control.group()):04X}"
        raise LayoutError(f"invalid path {path!r}: a control character ({code}) in a file name")
    return _slash_path(path, "path", 4096, "\\")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _slash_path(value: str, what: str, max_length: int, forbidden: str) -> str:
    """``value`` if it is ``/``-separated parts, none empty, ``.`` or ``..`` (so not absolute),
    and Unicode text a file name can hold: no lone surrogate (a JSON ``"\udc80"``, or a
    name read from disk that is not UTF-8), which no UTF-8 encoder accepts."""
    if (
        not value
        or len(value) > max_length
        or any(p in {"", ".", ".."} for p in value.split("/"))
        or any(c in value for c in forbidden)
        or not _encodable(value)
    ):
        raise LayoutError(f"invalid {what} {value!r}")
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def repo_folder_name(repo_id: str, repo_type: str = "model") -> str:
    """``models--org--name`` as the stock client names it."""
    if repo_type not in REPO_TYPE_PREFIX:
        raise LayoutError(f"invalid repo type {repo_type!r}")
    return "--".join([REPO_TYPE_PREFIX[repo_type], *validate_repo_id(repo_id).split("/")])


def parse_repo_folder(name: str) -> tuple[str, str] | None:
    """``(repo_type, repo_id)`` of a repo folder name, or ``None`` if it is not one."""
    prefix, sep, rest = name.partition("--")
    if not sep or prefix not in PREFIX_REPO_TYPE:
        return None
    repo_id = rest.replace("--", "/")
    try:
        validate_repo_id(repo_id)
    except LayoutError:
        return None
    return PREFIX_REPO_TYPE[prefix], repo_id


#: where a mirror records, per repo, the blobs it found to hash to their names
CHECK_RECORDS = ".cmh/checked"
#: where the resolver marks, per repo, the blobs it hashed against their names
VERIFIED_MARKERS = ".cmh/verified"
#: where a bucket pull-through keeps, per repo, each blob's fill: ``{etag}/lease``, its
#: ``part-NNNNNN`` objects and ``failed`` (spec/hub-mirror.md 8.6)
FILL_STATE = ".cmh/fills"
#: seconds a fill lease lives without renewal, unless its holder wrote another lifetime in
#: it (``cmh serve --fill-lease-ttl``); the pull-through and the pruner both judge by it
FILL_LEASE_TTL = 30.0
#: seconds by which an age measured between two storage times may exceed the true one: S3
#: gives ``Last-Modified`` in whole seconds (cut, not rounded), so a lease renewed at 10.9 s
#: reads as written at 10 s. A lease stays live until its measured age passes its lifetime
#: plus this margin (:func:`lease_left`; spec/hub-mirror.md 8.6).
LEASE_TIME_RESOLUTION = 1.0


def lease_left(age: float, ttl: float) -> float:
    """Seconds a lease (or a fill's state) of measured ``age`` has before it may be taken
    over or judged abandoned: its lifetime ``ttl`` plus :data:`LEASE_TIME_RESOLUTION`
    minus its age; negative once it has expired. The one rule every lease check (the
    pull-through, ``cmh mirror add``, the pruner; folder and bucket) goes by."""
    return ttl + LEASE_TIME_RESOLUTION - age


#: where a mirror records, per repo, when a body of each blob was last cut (spec 8.3)
CUT_RECORDS = ".cmh/cuts"
#: seconds after a cut during which ranges of that blob are answered whole (200)
CUT_MEMORY = 3600.0


class _RepoFolder:
    """A folder of the repo, as a read-only attribute: ``repo.blobs`` is ``repo.path / "blobs"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, repo: RepoLayout, owner: type | None = None) -> Path:
        return repo.path / self.name


@dataclass(frozen=True)
class RepoLayout:
    """Paths of one repo inside a cache or store rooted at ``root``."""

    root: Path
    repo_id: str
    repo_type: str = "model"

    @property
    def folder_name(self) -> str:
        return repo_folder_name(self.repo_id, self.repo_type)

    @property
    def path(self) -> Path:
        return self.root / self.folder_name

    #: ``blobs/``, ``snapshots/``, ``refs/``, ``.no_exist/``, ``trees/`` and cmh's own
    #: bookkeeping (usage records, partial downloads) in ``.cmh/``.
    blobs = _RepoFolder("blobs")
    snapshots = _RepoFolder("snapshots")
    refs = _RepoFolder("refs")
    no_exist = _RepoFolder(".no_exist")
    trees = _RepoFolder("trees")
    cmh_dir = _RepoFolder(".cmh")

    @property
    def locks(self) -> Path:
        """The stock client's lock folder for this repo: ``{root}/.locks/{folder}``."""
        return self.root / ".locks" / self.folder_name

    def blob_path(self, etag: str) -> Path:
        if not ETAG_RE.match(etag):
            raise LayoutError(f"invalid blob name {etag!r}")
        return self.blobs / etag

    def snapshot_dir(self, commit: str) -> Path:
        if not COMMIT_RE.match(commit):
            raise LayoutError(f"invalid commit {commit!r}")
        return self.snapshots / commit

    def snapshot_file(self, commit: str, relpath: str) -> Path:
        return self.snapshot_dir(commit).joinpath(*validate_relpath(relpath).split("/"))

    def ref_path(self, revision: str) -> Path:
        return self.refs.joinpath(*validate_revision(revision).split("/"))

    def read_ref(self, revision: str) -> str | None:
        """The commit a ref names, or ``None`` when it is absent or unreadable: not a
        regular file inside ``refs/`` (a symlink, itself or a folder on its way, a FIFO, a
        device), over :data:`MAX_REF_BYTES`, or not a commit id (:func:`parse_ref`). Never
        blocks, never reads more than the bound."""
        path = self.ref_path(revision)
        folder = self.refs
        for part in ("", *revision.split("/")[:-1]):  # refs/ and the folders below it
            folder = folder / part if part else folder
            if folder.is_symlink():
                return None
        try:
            data = read_small_file(path, MAX_REF_BYTES, follow_links=False)
        except OSError:
            return None
        return parse_ref(data)

    def write_ref(self, revision: str, commit: str) -> None:
        """Point ``refs/{revision}`` at ``commit`` atomically (temp file, fsync, rename)."""
        if not COMMIT_RE.match(commit):
            raise LayoutError(f"invalid commit {commit!r}")
        path = self.ref_path(revision)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, commit.encode())

    def refs_by_name(self) -> dict[str, str]:
        """Every ref (``main``, ``refs/pr/1`` ...) and the commit it names."""
        out: dict[str, str] = {}
        if not self.refs.is_dir():
            return out
        for p in self.refs.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                name = p.relative_to(self.refs).as_posix()
                commit = self.read_ref(name)
                if commit:
                    out[name] = commit
        return out

    def commits(self) -> list[str]:
        """Commits that have a snapshot folder."""
        if not self.snapshots.is_dir():
            return []
        return sorted(p.name for p in self.snapshots.iterdir() if COMMIT_RE.match(p.name))

    def link_snapshot_file(self, commit: str, relpath: str, etag: str) -> Path:
        """Make ``snapshots/{commit}/{relpath}`` a relative symlink to its blob, atomically."""
        link = self.snapshot_file(commit, relpath)
        link.parent.mkdir(parents=True, exist_ok=True)
        atomic_symlink(link, os.path.relpath(self.blob_path(etag), link.parent))
        return link

    def snapshot_files(self, commit: str) -> dict[str, Path]:
        """Files of a snapshot by repo path (symlinks not followed)."""
        base = self.snapshot_dir(commit)
        out: dict[str, Path] = {}
        if not base.is_dir():
            return out
        for p in base.rglob("*"):
            if p.is_symlink() or p.is_file():
                out[p.relative_to(base).as_posix()] = p
        return out


def default_cache_dir() -> Path:
    """The stock cache folder, from the environment as it is now.

    ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``
    (``HF_HOME`` defaults to ``$XDG_CACHE_HOME/huggingface`` or
    ``~/.cache/huggingface``), as ``huggingface_hub.constants`` computes it.
    """
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(os.path.expanduser(explicit)))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def iter_repos(root: str | os.PathLike[str]) -> Iterator[RepoLayout]:
    """Every repo folder under a cache or store root."""
    base = Path(root)
    if not base.is_dir():
        return
    for entry in sorted(base.iterdir()):
        parsed = parse_repo_folder(entry.name) if entry.is_dir() else None
        if parsed is not None:
            yield RepoLayout(base, parsed[1], parsed[0])


__all__ = [
    "COMMIT_RE",
    "ETAG_PATTERN",
    "ETAG_RE",
    "PREFIX_REPO_TYPE",
    "REPO_PART_RE",
    "REPO_TYPE_PREFIX",
    "LayoutError",
    "RepoLayout",
    "default_cache_dir",
    "iter_repos",
    "parse_repo_folder",
    "repo_folder_name",
    "validate_relpath",
    "validate_repo_id",
    "validate_revision",
]
