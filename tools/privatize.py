"""Make every module of cmh private (``_name.py``) behind its package's ``__init__``.

Issue 29: as in httpx, each subpackage's ``__init__`` is its public face and
lists its surface (``__all__``); the modules behind it are ``_name.py``. This
script does the renaming and keeps the tree that way, so it is re-run after
merges: it is deterministic and idempotent.

1. ``git mv`` each module of :data:`PRIVATE` to ``_name.py`` (a module that
   appeared since, neither listed nor in :data:`PUBLIC_MODULES`, is renamed too
   and named in the output, so it can be added to the list).
2. Rewrites every reference in :data:`REWRITE` (files and folders): dotted names
   (imports, ``monkeypatch``/``mock`` targets, ``python -m``, config),
   relative imports (``from .app import x``, ``from . import app``,
   ``from .. import x``), file paths (``hub/mirror/app.py``) and the lazy export
   tables of the ``__init__`` files.
3. An import that leaves its unit (see :data:`UNITS`) is made absolute and goes
   through the face: ``from cmh.hub.mirror._app import X`` in another unit
   becomes ``from cmh.hub.mirror import X`` when ``X`` is in the face's
   ``__all__``. README.md, spec/ and the docstrings and comments of other units
   name public objects by their face too (``cmh.hub.mirror.nginx_server``).
4. Reports what is left (exit status 1): a private module imported across
   units, a name missing from a face. ``--check`` reports without writing.

A unit's own tests (:data:`TEST_OWNERS`) may import its private modules. Not
rewritten: a module named by its bare name in a string (``graph["patch"]``).
Run it from anywhere: ``.venv/bin/python tools/privatize.py [--check]``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Import name of each source folder (pyproject.toml maps hub/ and cli/ into cmh).
SOURCE_DIRS = {"cmh": "cmh", "cmh.hub": "hub", "cmh.cli": "cli"}

# The units: a module belongs to the longest one that prefixes it. Inside a unit
# any module may import any other; across units only faces and public modules.
UNITS = (
    "cmh",  # the format: cmh/*.py and cmh/semantic/
    "cmh.hub",  # the hub's own package (its __init__ and _lazy)
    "cmh.hub.cache",
    "cmh.hub.resolver",
    "cmh.hub.mirror",  # with mirror.stores and mirror.web
    "cmh.hub.prune",
    "cmh.cli",
)

# A package whose private modules are open to the units beneath it (the Python
# convention for a package's own helpers): cmh.hub._lazy serves the hub's
# subpackages' __init__s. The format (cmh/) is not one: hub/ and cli/ are
# separate source trees mapped into it.
OPEN_TO_SUBPACKAGES = ("cmh.hub",)

# Modules that stay public faces besides every package's __init__ and __main__:
# cmh.torch is user API (``import cmh.torch``), cmh.cli.main the console script.
PUBLIC_MODULES = ("cmh.torch", "cmh.cli.main")

# The mapping: each of these becomes ``<package>._<name>``.
PRIVATE = (
    "cmh.carrier",
    "cmh.checkpoint",
    "cmh.checks",
    "cmh.digests",
    "cmh.duration",
    "cmh.errors",
    "cmh.header",
    "cmh.inspection",
    "cmh.record",
    "cmh.signing",
    "cmh.stamping",
    "cmh.verification",
    "cmh.writer",
    "cmh.semantic.canonical",
    "cmh.semantic.errors",
    "cmh.semantic.files",
    "cmh.semantic.model",
    "cmh.semantic.reader",
    "cmh.semantic.task",
    "cmh.semantic.tensors",
    "cmh.hub.cache.blobs",
    "cmh.hub.cache.clock",
    "cmh.hub.cache.housekeeping",
    "cmh.hub.cache.layout",
    "cmh.hub.cache.locks",
    "cmh.hub.cache.usage",
    "cmh.hub.mirror.app",
    "cmh.hub.mirror.auth",
    "cmh.hub.mirror.catalog",
    "cmh.hub.mirror.connections",
    "cmh.hub.mirror.cuts",
    "cmh.hub.mirror.derived",
    "cmh.hub.mirror.documents",
    "cmh.hub.mirror.errors",
    "cmh.hub.mirror.filling",
    "cmh.hub.mirror.front_matter",
    "cmh.hub.mirror.fingerprints",
    "cmh.hub.mirror.gitobjects",
    "cmh.hub.mirror.history",
    "cmh.hub.mirror.hub_documents",
    "cmh.hub.mirror.index",
    "cmh.hub.mirror.manifests",
    "cmh.hub.mirror.memo",
    "cmh.hub.mirror.observe",
    "cmh.hub.mirror.ranges",
    "cmh.hub.mirror.routes",
    "cmh.hub.mirror.run",
    "cmh.hub.mirror.scrub_history",
    "cmh.hub.mirror.send",
    "cmh.hub.mirror.upstream",
    "cmh.hub.mirror.stores.bucket.bucket",
    "cmh.hub.mirror.stores.bucket.delivery",
    "cmh.hub.mirror.stores.bucket.objectstore",
    "cmh.hub.mirror.stores.bucket.pull",
    "cmh.hub.mirror.stores.bucket.read",
    "cmh.hub.mirror.stores.bucket.scrub",
    "cmh.hub.mirror.stores.bucket.send",
    "cmh.hub.mirror.stores.bucket.store",
    "cmh.hub.mirror.stores.local.folder",
    "cmh.hub.mirror.stores.local.pull",
    "cmh.hub.mirror.stores.local.scrub",
    "cmh.hub.mirror.stores.local.store",
    "cmh.hub.mirror.stores.local.verify",
    "cmh.hub.mirror.stores.local.xaccel",
    "cmh.hub.mirror.web.card_images",
    "cmh.hub.mirror.web.card_worker",
    "cmh.hub.mirror.web.cards",
    "cmh.hub.mirror.web.facets",
    "cmh.hub.mirror.web.options",
    "cmh.hub.mirror.web.pages",
    "cmh.hub.mirror.web.preview",
    "cmh.hub.mirror.web.render",
    "cmh.hub.mirror.web.session",
    "cmh.hub.mirror.web.snippet",
    "cmh.hub.mirror.web.urls",
    "cmh.hub.mirror.web.views",
    "cmh.hub.prune.bucket",
    "cmh.hub.prune.execute",
    "cmh.hub.prune.plan",
    "cmh.hub.prune.scan",
    "cmh.hub.prune.targets",
    "cmh.hub.resolver.answers",
    "cmh.hub.resolver.chunked",
    "cmh.hub.resolver.credentials",
    "cmh.hub.resolver.fetch",
    "cmh.hub.resolver.http",
    "cmh.hub.resolver.local",
    "cmh.hub.resolver.multipart",
    "cmh.hub.resolver.negotiate",
    "cmh.hub.resolver.origins",
    "cmh.hub.resolver.partial",
    "cmh.hub.resolver.patch",
    "cmh.hub.resolver.retry",
    "cmh.hub.resolver.session",
    "cmh.hub.resolver.transfer",
    "cmh.hub.resolver.types",
    "cmh.hub.resolver.window",
    "cmh.cli.format_commands",
    "cmh.cli.mirror_commands",
    "cmh.cli.prune_command",
    "cmh.cli.prune_report",
    "cmh.cli.pull_command",
    "cmh.cli.store_location",
)

# Which unit's tests a test file is (first match wins): those may import the
# unit's private modules. Shared helpers (conftest, seaweed, hublike, ...) are
# no unit's and use faces only.
TEST_OWNERS = (
    ("tests/test_cli*.py", "cmh.cli"),
    ("tests/cli_support.py", "cmh.cli"),
    ("tests/hub/test_cli_*.py", "cmh.cli"),
    ("tests/hub/test_cache_*.py", "cmh.hub.cache"),
    ("tests/hub/test_resolver*.py", "cmh.hub.resolver"),
    ("tests/hub/resolver_support.py", "cmh.hub.resolver"),
    ("tests/hub/test_dropin_*.py", "cmh.hub.resolver"),
    ("tests/hub/hostile_proxy.py", "cmh.hub.resolver"),
    ("tests/hub/test_prune*.py", "cmh.hub.prune"),
    ("tests/hub/prune_*.py", "cmh.hub.prune"),
    ("tests/hub/test_mirror_*.py", "cmh.hub.mirror"),
    ("tests/hub/test_web_*.py", "cmh.hub.mirror"),
    ("tests/hub/test_bucket_*.py", "cmh.hub.mirror"),
    ("tests/hub/test_objectstore.py", "cmh.hub.mirror"),
    ("tests/hub/test_store_parity.py", "cmh.hub.mirror"),
    ("tests/hub/test_pullthrough*.py", "cmh.hub.mirror"),
    ("tests/hub/mirror_support.py", "cmh.hub.mirror"),
    ("tests/hub/web_support.py", "cmh.hub.mirror"),
    ("tests/hub/bucket_support.py", "cmh.hub.mirror"),
    ("tests/hub/nginx_support.py", "cmh.hub.mirror"),
    ("tests/hub/fleet_support.py", "cmh.hub.mirror"),
    ("tests/hub/test_semantic_*.py", "cmh"),
    ("tests/test_*.py", "cmh"),
    ("tests/format_support.py", "cmh"),
    ("tests/spec_reader.py", "cmh"),
)

# What is rewritten (CHANGELOG.md is history and stays as written).
REWRITE = (
    "cmh",
    "hub",
    "cli",
    "tests",
    "bench",
    "tools",
    "docs",
    "spec",
    "README.md",
    "pyproject.toml",
    "Makefile",
)
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yaml", ".yml", ".sh", ""}
# Documents for users: a public object is named by its face (cmh.hub.mirror.serve).
USER_DOCS = ("README.md", "spec")
# This script and its test name the old modules on purpose.
SKIP = ("tools/privatize.py", "tests/test_privatize.py")

DOTTED = re.compile(r"(?<![\w.])cmh(?:\.[A-Za-z_]\w*)+")
SOURCE_PATH = re.compile(r"(?<![\w/.-])(cmh|hub|cli)/((?:[A-Za-z_]\w*/)*)([A-Za-z_]\w*)\.py\b")


@dataclass
class Tree:
    """The package tree as it is on disk: modules, packages and the renames."""

    modules: dict[str, Path] = field(default_factory=dict)  # dotted name -> file
    packages: set[str] = field(default_factory=set)
    renames: dict[str, str] = field(default_factory=dict)  # old dotted -> new dotted
    surfaces: dict[str, set[str] | None] = field(default_factory=dict)  # face -> __all__

    def is_module(self, name: str) -> bool:
        return name in self.modules or name in self.packages

    def new_name(self, dotted: str) -> str:
        """``dotted`` with every renamed module in it replaced (attributes after it kept)."""
        parts = dotted.split(".")
        out = [parts[0]]
        for part in parts[1:]:
            prefix = ".".join(out)
            if prefix not in self.packages:
                out.append(part)  # an attribute of a module: nothing below it is renamed
                continue
            candidate = f"{prefix}.{part}"
            out.append(self.renames.get(candidate, candidate).rsplit(".", 1)[1])
        return ".".join(out)


def dotted_of(path: Path) -> str | None:
    """The import name of a source file (``hub/mirror/_app.py`` -> ``cmh.hub.mirror._app``)."""
    rel = path.relative_to(ROOT).with_suffix("")
    for package, folder in sorted(SOURCE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if rel.parts[0] == folder:
            rest = list(rel.parts[1:])
            if rest and rest[-1] == "__init__":
                rest.pop()
            return ".".join([package, *rest])
    return None


def unit_of(dotted: str) -> str:
    return max((u for u in UNITS if dotted == u or dotted.startswith(u + ".")), key=len)


def owner_of(path: Path) -> str | None:
    """The unit a file belongs to: its own for source, :data:`TEST_OWNERS` for tests."""
    dotted = dotted_of(path)
    if dotted is not None:
        return unit_of(dotted)
    rel = path.relative_to(ROOT).as_posix()
    for pattern, unit in TEST_OWNERS:
        if fnmatch.fnmatch(rel, pattern):
            return unit
    return None


def private_part(dotted: str) -> str | None:
    """The face in front of the first private module of ``dotted``, or None if it has none."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def may_import(owner: str | None, target: str) -> bool:
    """Whether a file of unit ``owner`` may import the (already renamed) module ``target``."""
    face = private_part(target)
    if face is None:
        return True
    if owner is not None and unit_of(target) == owner:
        return True
    return (
        owner is not None
        and face in OPEN_TO_SUBPACKAGES
        and owner.startswith(face + ".")
        and target.count(".") == face.count(".") + 1  # only the face's own modules
    )


def source_files() -> Iterator[Path]:
    for folder in SOURCE_DIRS.values():
        yield from sorted((ROOT / folder).rglob("*.py"))


def scan_tree() -> Tree:
    tree = Tree()
    for path in source_files():
        dotted = dotted_of(path)
        assert dotted is not None
        if path.name == "__init__.py":
            tree.packages.add(dotted)
        else:
            tree.modules[dotted] = path
    return tree


def plan_renames(tree: Tree) -> tuple[dict[str, str], list[str]]:
    """Old -> new dotted names: :data:`PRIVATE`, plus public modules found since (listed)."""
    renames = {old: private_name(old) for old in PRIVATE}
    found = []
    for dotted in sorted(tree.modules):
        leaf = dotted.rsplit(".", 1)[1]
        if leaf.startswith("_") or dotted in PUBLIC_MODULES or dotted in renames:
            continue
        renames[dotted] = private_name(dotted)
        found.append(dotted)
    return renames, found


def private_name(dotted: str) -> str:
    package, leaf = dotted.rsplit(".", 1)
    return f"{package}._{leaf}"


def path_of(tree: Tree, dotted: str) -> Path:
    package, leaf = dotted.rsplit(".", 1)
    init = next(p for d, p in _package_dirs(tree) if d == package)
    return init / f"{leaf}.py"


def _package_dirs(tree: Tree) -> Iterator[tuple[str, Path]]:
    for path in source_files():
        if path.name == "__init__.py":
            dotted = dotted_of(path)
            assert dotted is not None
            yield dotted, path.parent


def git_mv(tree: Tree, renames: dict[str, str], write: bool) -> list[str]:
    moved = []
    for old, new in renames.items():
        if old.rsplit(".", 1)[0] not in tree.packages:
            continue
        src, dst = path_of(tree, old), path_of(tree, new)
        if not src.exists():
            continue
        if dst.exists():
            raise SystemExit(f"privatize: both {src} and {dst} exist; merge them by hand first")
        moved.append(f"{src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}")
        if write:
            subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)
    return moved


def rewrite_files() -> Iterator[Path]:
    for entry in REWRITE:
        path = ROOT / entry
        if path.is_file():
            yield path
        elif path.is_dir():
            for item in sorted(path.rglob("*")):
                if (
                    item.is_file()
                    and item.suffix in TEXT_SUFFIXES
                    and "__pycache__" not in item.parts
                    and item.relative_to(ROOT).as_posix() not in SKIP
                ):
                    yield item


# ---------------------------------------------------------------- text rewrites


def rewrite_text(tree: Tree, text: str) -> str:
    text = DOTTED.sub(lambda m: tree.new_name(m.group(0)), text)

    def path_sub(m: re.Match[str]) -> str:
        folder, middle, leaf = m.group(1), m.group(2), m.group(3)
        package = next(p for p, f in SOURCE_DIRS.items() if f == folder)
        dotted = ".".join([package, *middle.strip("/").split("/")] if middle else [package])
        new = tree.new_name(f"{dotted}.{leaf}").rsplit(".", 1)[1]
        return f"{folder}/{middle}{new}.py"

    return SOURCE_PATH.sub(path_sub, text)


# ---------------------------------------------------------------- faces


def face_surface(tree: Tree, face: str) -> set[str] | None:
    """The names in ``face``'s ``__all__`` (a package ``__init__`` or a public module)."""
    cache = tree.surfaces
    if face in cache:
        return cache[face]
    cache[face] = None
    path = _file_of(tree, face)
    if path is None:
        return None
    module = ast.parse(path.read_text())
    names: set[str] = set()
    imported: dict[str, str] = {}  # local name -> the module whose __all__ it is
    is_package = face in tree.packages
    for node in module.body:
        if isinstance(node, ast.ImportFrom):  # `from .types import __all__ as _types`
            source = _resolve(face, is_package, node.level, node.module) if node.level else None
            source = tree.new_name(source or node.module or "")
            for alias in node.names:
                if alias.name == "__all__":
                    imported[alias.asname or alias.name] = source
        target, value = _all_assignment(node)
        if target is None:
            continue
        if isinstance(value, ast.List | ast.Tuple):
            names |= {
                e.value
                for e in value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
        elif isinstance(value, ast.Name) and value.id in imported:
            names |= face_surface(tree, imported[value.id]) or set()
        else:
            raise SystemExit(f"privatize: cannot read {face}.__all__ (line {node.lineno})")
    cache[face] = names
    return names


def _all_assignment(node: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return "__all__", node.value
    return None, None


def _file_of(tree: Tree, dotted: str) -> Path | None:
    if dotted in tree.packages:
        return next(p for d, p in _package_dirs(tree) if d == dotted) / "__init__.py"
    return tree.modules.get(dotted)


def _resolve(package: str, is_package: bool, level: int, module: str | None) -> str:
    base = package.split(".") if is_package else package.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


# ---------------------------------------------------------------- python rewrites


@dataclass
class Edit:
    start: int
    end: int
    text: str


@dataclass
class Report:
    moved: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class Source:
    """One Python file being rewritten, and where its findings go."""

    tree: Tree
    path: Path
    text: str
    report: Report
    dotted: str | None = None  # its import name, for a file of the package
    owner: str | None = None  # its unit (TEST_OWNERS for tests)
    offsets: list[int] = field(default_factory=list)  # where each line starts

    def __post_init__(self) -> None:
        self.dotted = dotted_of(self.path)
        self.owner = owner_of(self.path)
        self.offsets = _line_offsets(self.text)

    def at(self, line: int, col: int) -> int:
        return self.offsets[line - 1] + col

    def problem(self, node: ast.stmt, message: str) -> None:
        self.report.problems.append(f"{_rel(self.path)}:{node.lineno}: {message}")


def rewrite_python(tree: Tree, path: Path, text: str, report: Report) -> str:
    """Relative imports, imports across units, lazy export tables."""
    try:
        module = ast.parse(text)
    except SyntaxError as exc:
        report.problems.append(f"{_rel(path)}: cannot parse: {exc}")
        return text
    src = Source(tree, path, text, report)
    edits: list[Edit] = []
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom):
            edits += _import_from(src, node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                target = tree.new_name(alias.name)
                if alias.name.startswith("cmh.") and not may_import(src.owner, target):
                    src.problem(
                        node,
                        f"import {alias.name}: private module of another unit "
                        f"(import names from its face {private_part(target)})",
                    )
    if path.name == "__init__.py" and src.dotted is not None:
        edits.extend(_export_tables(src, module))
    edits.extend(_prose_edits(src, module))
    for edit in sorted(edits, key=lambda e: -e.start):
        text = text[: edit.start] + edit.text + text[edit.end :]
    return text


Aliases = list[tuple[str, str | None]]  # (name, as-name) of an import


def _import_from(src: Source, node: ast.ImportFrom) -> list[Edit]:
    """The edits that rename, make absolute or route through a face one ``from`` import."""
    tree, is_package = src.tree, src.path.name == "__init__.py"
    if node.level:
        if src.dotted is None:
            return []
        target = _resolve(src.dotted, is_package, node.level, node.module)
    elif node.module and (node.module == "cmh" or node.module.startswith("cmh.")):
        target = node.module
    else:
        return []
    new_target = tree.new_name(target)
    aliases: Aliases = []
    for alias in node.names:  # `from . import app`: the name is a module
        sub = tree.new_name(f"{new_target}.{alias.name}")
        leaf = sub.rsplit(".", 1)[1]
        if leaf != alias.name and tree.is_module(sub):
            aliases.append((leaf, alias.asname or alias.name))
        else:
            aliases.append((alias.name, alias.asname))
    leaves_unit = src.owner is not None and unit_of(new_target) != src.owner
    if leaves_unit and node.level and may_import(src.owner, new_target):
        leaves_unit = private_part(new_target) is None  # cmh.hub._lazy stays relative
    if leaves_unit or (src.owner is None and node.level == 0):
        module_text = _through_face(src, node, new_target, aliases)
    elif node.level:
        base = _resolve(src.dotted or "", is_package, node.level, None)
        module_text = "." * node.level + new_target[len(base) :].lstrip(".")
    else:
        module_text = new_target
    edits = []
    start = src.at(node.lineno, node.col_offset)
    head = re.match(r"from\s+([.\w]+)\s+import\b", src.text[start:])
    assert head is not None, f"{_rel(src.path)}:{node.lineno}"
    if head.group(1) != module_text:
        edits.append(Edit(start + head.start(1), start + head.end(1), module_text))
    for alias, (name, asname) in zip(node.names, aliases, strict=True):
        if name == alias.name and asname == alias.asname:
            continue
        assert alias.end_lineno is not None and alias.end_col_offset is not None
        a_start = src.at(alias.lineno, alias.col_offset)
        a_end = src.at(alias.end_lineno, alias.end_col_offset)
        edits.append(
            Edit(a_start, a_end, name if asname in (None, name) else f"{name} as {asname}")
        )
    return edits


def _through_face(src: Source, node: ast.ImportFrom, target: str, aliases: Aliases) -> str:
    """The face to import from instead of ``target``, a private module of another unit.

    ``target`` itself when it may be imported, or when a name is missing from the
    face's ``__all__`` (reported: add it to the face).
    """
    tree, owner = src.tree, src.owner
    if may_import(owner, target) and all(
        may_import(owner, f"{target}.{n}") or not tree.is_module(f"{target}.{n}")
        for n, _ in aliases
    ):
        return target
    face = private_part(target) or target
    surface = face_surface(tree, face) or set()
    missing = []
    for name, _ in aliases:
        if tree.is_module(f"{target}.{name}") and private_part(f"{target}.{name}"):
            src.problem(
                node, f"imports module {target}.{name} of another unit: import names from {face}"
            )
        elif name not in surface and name != "*":
            missing.append(name)
    for name in missing:
        src.problem(
            node,
            f"{name} (from {target}) is not in {face}.__all__: "
            "add it to that face or keep the import inside the unit",
        )
    return target if missing else face


def _export_tables(src: Source, module: ast.Module) -> list[Edit]:
    """String values naming this package's modules in an ``__init__``'s dict literals."""
    tree, package = src.tree, src.dotted
    edits: list[Edit] = []
    for node in ast.walk(module):
        if not isinstance(node, ast.Dict) or not node.values:
            continue
        values = [
            (v, v.value)
            for v in node.values
            if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
        if len(values) != len(node.values):
            continue
        if not all(tree.is_module(tree.new_name(f"{package}.{name}")) for _, name in values):
            continue
        for v, name in values:
            new = tree.new_name(f"{package}.{name}")[len(package) + 1 :]  # a subpackage's too
            if new != name:
                assert v.end_lineno is not None and v.end_col_offset is not None
                start, end = src.at(v.lineno, v.col_offset), src.at(v.end_lineno, v.end_col_offset)
                edits.append(Edit(start, end, f'"{new}"'))
    return edits


def _line_offsets(text: str) -> list[int]:
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


def face_names_in_docs(tree: Tree, text: str, owner: str | None = None) -> str:
    """``cmh.hub.mirror._xaccel.nginx_server`` -> ``cmh.hub.mirror.nginx_server``.

    For a reader outside the unit (``owner``): a public object is named by its face.
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group(0)
        face = private_part(name)
        if face is None or (owner is not None and unit_of(face) == owner):
            return name
        rest = name[len(face) + 1 :].split(".")
        # rest[0] is the private module; rest[1] the object, if any.
        if len(rest) >= 2 and rest[1] in (face_surface(tree, face) or set()):
            return ".".join([face, *rest[1:]])
        return name

    return DOTTED.sub(sub, text)


def _prose_edits(src: Source, module: ast.Module) -> list[Edit]:
    """Docstrings and comments of a file name other units' public objects by their face.

    Strings in code are left alone: ``"cmh.hub.mirror._app.time"`` may be a mock
    target, which must name the module the code looks the name up in.
    """
    spans = []
    for node in ast.walk(module):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            assert isinstance(body, list)
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                v = first.value
                assert v.end_lineno is not None and v.end_col_offset is not None
                spans.append(
                    (src.at(v.lineno, v.col_offset), src.at(v.end_lineno, v.end_col_offset))
                )
    with contextlib.suppress(tokenize.TokenError, SyntaxError):
        for token in tokenize.generate_tokens(io.StringIO(src.text).readline):
            if token.type == tokenize.COMMENT:
                spans.append((src.at(*token.start), src.at(*token.end)))
    edits = []
    for start, end in spans:
        segment = src.text[start:end]
        new = face_names_in_docs(src.tree, segment, src.owner)
        if new != segment:
            edits.append(Edit(start, end, new))
    return edits


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# ---------------------------------------------------------------- main


def run(write: bool) -> Report:
    report = Report()
    tree = scan_tree()
    renames, report.found = plan_renames(tree)
    report.moved = git_mv(tree, renames, write)
    if write:
        tree = scan_tree()
    tree.renames = renames
    if not write:  # --check: pretend the moves happened
        for old, new in renames.items():
            if old in tree.modules:
                tree.modules[new] = tree.modules.pop(old)
    for old in renames:  # `pkg.leaf` must name one thing: the module, not a public object
        package, leaf = old.rsplit(".", 1)
        if leaf in (face_surface(tree, package) or set()):
            report.problems.append(f"{old}: a module named as a name in {package}.__all__")
    for path in rewrite_files():
        rel = _rel(path)
        try:
            before = path.read_text()
        except UnicodeDecodeError:
            continue
        text = rewrite_text(tree, before)
        if path.suffix == ".py":
            text = rewrite_python(tree, path, text, report)
        if rel in USER_DOCS or rel.startswith(tuple(f"{d}/" for d in USER_DOCS)):
            text = face_names_in_docs(tree, text)
        if text != before:
            report.changed.append(rel)
            if write:
                path.write_text(text)
    if write:
        report.problems += _tidy([ROOT / p for p in report.changed if p.endswith(".py")])
    return report


def _tidy(paths: list[Path]) -> list[str]:
    """Sort the rewritten imports, format the files; the lines a longer name made too long."""
    if not paths:
        return []
    files = [str(p) for p in paths]
    ruff = [sys.executable, "-m", "ruff"]
    subprocess.run([*ruff, "check", "--quiet", "--select", "I", "--fix", *files], cwd=ROOT)
    subprocess.run([*ruff, "format", "--quiet", *files], cwd=ROOT, check=True)
    long = subprocess.run(
        [*ruff, "check", "--quiet", "--select", "E501", "--output-format", "concise", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return [f"{line} (split it by hand)" for line in long.stdout.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report only; change no file")
    args = parser.parse_args(argv)
    report = run(write=not args.check)
    verb = "would move" if args.check else "moved"
    for line in report.moved:
        print(f"{verb} {line}")
    for dotted in report.found:
        print(f"note: {dotted} is not in PRIVATE (privatized as well; add it to the list)")
    verb = "would change" if args.check else "changed"
    print(f"{verb} {len(report.changed)} files")
    for problem in report.problems:
        print(f"problem: {problem}")
    return 1 if report.problems or (args.check and (report.moved or report.changed)) else 0


if __name__ == "__main__":
    sys.exit(main())
