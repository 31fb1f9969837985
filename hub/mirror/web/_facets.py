"""Facets of the repo list (task, library, license, tag) and the tag chips of a repo page.

Both come from the card fields the Hub API derives for ``GET /api/models/{repo}``
(:class:`~cmh.hub.mirror._derived.CardFields`: ``pipeline_tag``, ``library_name``,
``cardData`` and the Hub's ``tags``), so a chip and the facet it links to say
what the API says. Plain functions, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._derived import CardFields

#: The list's facets: query parameter, heading.
FACETS = (("task", "Task"), ("library", "Library"), ("license", "License"))
#: The list's filters: the facets, and any tag of the Hub's ``tags`` (what chips link to).
FILTERS = (*(name for name, _ in FACETS), "tag")
#: Values shown per facet on the list page (the most frequent first).
FACET_VALUES = 12
#: Plain tags shown on a repo page before "more".
TAGS_SHOWN = 12
#: Datasets (and base models) shown inline before they fold into a "show all".
INLINE_LINKS = 3
_PREFIXES = ("dataset:", "base_model:", "license:")


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return ()


@dataclass(frozen=True)
class RepoFacets:
    """The facet values of one repo."""

    task: tuple[str, ...]
    library: tuple[str, ...]
    license: tuple[str, ...]
    tag: tuple[str, ...]

    def values(self, facet: str) -> tuple[str, ...]:
        result: tuple[str, ...] = getattr(self, facet)
        return result


def repo_facets(fields: CardFields, repo_type: str) -> RepoFacets:
    """Facets from the API's card fields (a dataset's task is its ``task_categories``)."""
    data = fields.card_data or {}
    task = _strings(fields.pipeline_tag)
    if repo_type == "dataset":
        task = _strings(data.get("task_categories"))
    return RepoFacets(
        task=task,
        library=_strings(fields.library_name),
        license=_strings(data.get("license")),
        tag=tuple(fields.tags),
    )


def matches(facets: RepoFacets, wanted: dict[str, str]) -> bool:
    """Whether a repo has every wanted facet value (exact, case-sensitive as on the Hub)."""
    return all(value in facets.values(name) for name, value in wanted.items() if value)


def facet_counts(repos: Iterable[RepoFacets]) -> dict[str, list[tuple[str, int]]]:
    """Per facet, its most frequent values with how many repos have each."""
    counts: dict[str, Counter[str]] = {name: Counter() for name, _ in FACETS}
    for facets in repos:
        for name, _ in FACETS:
            counts[name].update(set(facets.values(name)))
    return {
        name: sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:FACET_VALUES]
        for name, c in counts.items()
    }


@dataclass(frozen=True)
class Chip:
    """A tag chip of a repo page: its text and the list filter it links to."""

    label: str
    facet: str
    value: str


@dataclass(frozen=True)
class TagGroups:
    """A repo page's chips: facets first, plain tags, then the long lists folded."""

    facets: tuple[Chip, ...]
    tags: tuple[Chip, ...]
    more_tags: tuple[Chip, ...]
    datasets: tuple[Chip, ...]
    base_models: tuple[Chip, ...]

    @property
    def empty(self) -> bool:
        return not (self.facets or self.tags or self.datasets or self.base_models)


def tag_groups(fields: CardFields, repo_type: str) -> TagGroups:
    """The chips of a repo page: task, library and license first; ``dataset:`` and
    ``base_model:`` tags in their own groups (a card may name dozens of datasets)."""
    facets = repo_facets(fields, repo_type)
    head = [Chip(f"{heading.lower()}: {v}", name, v) for name, heading in FACETS
            for v in facets.values(name)]  # fmt: skip
    skip = set(facets.task) | set(facets.library)
    plain = [
        Chip(t, "tag", t) for t in fields.tags if t not in skip and not t.startswith(_PREFIXES)
    ]
    datasets = [Chip(t.split(":", 1)[1], "tag", t) for t in fields.tags if t.startswith("dataset:")]
    bases = [Chip(t.split(":", 1)[1], "tag", t) for t in fields.tags if t.startswith("base_model:")]
    return TagGroups(
        tuple(head), tuple(plain[:TAGS_SHOWN]), tuple(plain[TAGS_SHOWN:]), tuple(datasets),
        tuple(bases),
    )  # fmt: skip


def human_count(n: int) -> str:
    """A parameter count as the Hub writes it: ``22.7M``, ``1.2B``, ``950``."""
    for size, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + unit
    return str(n)
