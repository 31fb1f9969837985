"""Model cards: YAML front matter and Markdown, rendered so that no card can run a script.

A card is untrusted input. It is rendered by markdown-it-py with raw HTML
turned off (``html=False``: every ``<tag>`` in the card is shown as text) and a
link check that keeps only ``http``, ``https`` and ``mailto`` URLs and relative
ones: ``javascript:``, ``vbscript:``, ``data:`` and every other scheme never
become a link or an image. The result holds no element with an event handler
and no URL that runs code, so no HTML sanitizer is needed on top; the pages
also send a Content-Security-Policy that allows no inline script.

Rendering is bounded in time and size: :func:`render_card_body` runs in a child
process that is ended at its deadline (:mod:`~cmh.hub.mirror.web._card_worker`),
and HTML longer than :data:`MAX_CARD_HTML_BYTES` is not kept. A card that is not
rendered is shown as text (escaped, inside ``<pre>``) with a note saying why.
Rendered cards are kept per blob, :data:`CARD_CACHE_BYTES` of them in all.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, BinaryIO

from cmh import format_size

from .._front_matter import read_front_matter
from .._memo import Memo
from ._card_images import NO_IMAGES, ForeignImages, foreign_images

if TYPE_CHECKING:
    from .._index import FileEntry

#: Cards larger than this are shown cut (the time to render one is bounded by the
#: renderer's deadline, :data:`~._card_worker.RENDER_SECONDS`, not by this).
MAX_CARD_BYTES = 512 * 1024
#: A card with more ``[`` than this is shown as text: markdown-it's link scan costs ~70 us
#: per unclosed bracket, so 512 KiB of ``[`` took 15 s of CPU (issue 23).
MAX_CARD_BRACKETS = 2000
#: A card with more emphasis markers (``*``, ``_`` and strikethrough's ``~``) than this is
#: shown as text: pairing them costs ~15-20 us each, so 500 KB of them took 7.5 s of CPU
#: (issue 35), 512 KiB of ``~~a`` 3.8 s.
MAX_CARD_EMPHASIS = 20_000
#: A card whose HTML is longer than this (UTF-8 bytes) is shown as text: a 512 KiB fenced
#: Python block highlights to 12.6 MB, which every view would send and the cache keep.
MAX_CARD_HTML_BYTES = 4 * 1024 * 1024
#: Bytes of rendered cards kept per worker, by blob (file identity): a page view renders
#: once. Each card weighs its HTML and its source (:attr:`Card.weight`).
CARD_CACHE_BYTES = 64 * 1024 * 1024
#: Front-matter keys shown as tags, in this order (the Hub's usual card metadata).
TAG_KEYS = (
    "license",
    "pipeline_tag",
    "library_name",
    "language",
    "base_model",
    "datasets",
    "tags",
)
_SAFE_SCHEMES = frozenset({"http", "https", "mailto"})
_SCHEME_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.\-]*):")


@dataclass(frozen=True)
class Card:
    """A rendered model card: body HTML (safe), front matter, tags, what went wrong, its
    images from other sites (read once, when it is rendered) and its weight in the cache
    (bytes: its HTML and the source it was made from)."""

    html: str
    front_matter: dict[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    images: ForeignImages = NO_IMAGES
    weight: int = 0


@dataclass(frozen=True)
class Rendered:
    """What rendering a card's body gave: its HTML and images, or (``html`` ``None``) why
    it is shown as text instead."""

    html: str | None
    images: ForeignImages = NO_IMAGES
    problem: str = ""


def safe_link(url: str) -> bool:
    """True for relative URLs and ``http``/``https``/``mailto`` ones (markdown-it's link check)."""
    match = _SCHEME_RE.match(url)
    return match is None or match.group(1).lower() in _SAFE_SCHEMES


@lru_cache(maxsize=1)
def _renderer() -> Any:
    from markdown_it import MarkdownIt

    class CardMarkdown(MarkdownIt):
        """CommonMark plus tables and strikethrough; links checked by :func:`safe_link`."""

        def validateLink(self, url: str) -> bool:
            return safe_link(url)

    options = {"html": False, "linkify": False, "typographer": False, "highlight": highlight_fence}
    md = CardMarkdown("commonmark", options)
    return md.enable(["table", "strikethrough"])


def highlight_fence(code: str, lang: str, attrs: str) -> str:
    """A fenced code block of a card, highlighted by Pygments when its language is one
    of the previews' (:data:`~._preview.HIGHLIGHTED`: few lexers, few regular expressions
    a hostile card can make slow); ``""`` leaves it to markdown-it (plain, escaped)."""
    from pygments import highlight
    from pygments.formatters.html import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    from ._preview import HIGHLIGHTED

    try:
        lexer = get_lexer_by_name(lang.strip().lower(), stripnl=False) if lang else None
    except ClassNotFound:
        lexer = None
    if lexer is None or lexer.aliases[0] not in HIGHLIGHTED or lexer.aliases[0] == "markdown":
        return ""
    spans = highlight(code, lexer, HtmlFormatter(nowrap=True))  # escaped; classes only
    language = lexer.aliases[0]  # a name of ours, not the card's text
    return f'<pre class="highlight"><code class="language-{language}">{spans}</code></pre>\n'


def render_markdown(text: str) -> str:
    """Markdown to HTML with raw HTML shown as text and only safe links (module docstring)."""
    return str(_renderer().render(text))


def render_card_body(body: str) -> Rendered:
    """A card's body rendered, its HTML bounded and its foreign images read: what the
    renderer's child process runs (:class:`~._card_worker.CardRenderer`)."""
    try:
        rendered = render_markdown(body)
    except Exception:  # RecursionError on deep nesting, or any other renderer failure
        return Rendered(None, problem="the card cannot be rendered")
    if len(rendered.encode("utf-8")) > MAX_CARD_HTML_BYTES:
        limit = format_size(MAX_CARD_HTML_BYTES)
        return Rendered(None, problem=f"the card renders to more than {limit} of HTML")
    return Rendered(rendered, foreign_images(rendered))


def split_front_matter(text: str) -> tuple[dict[str, Any], str, str | None]:
    """``(front matter, body, problem)`` of a card (:mod:`cmh.hub.mirror._front_matter`)."""
    front = read_front_matter(text)
    return front.data or {}, front.body, front.problem


def card_tags(front: dict[str, Any]) -> tuple[str, ...]:
    """Tags to show for a card's front matter: ``key: value`` for the known keys, then ``tags``."""
    out: list[str] = []
    for key in TAG_KEYS:
        value = front.get(key)
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, (str, int, float)) and not isinstance(item, bool):
                text = str(item)[:100]
                out.append(text if key == "tags" else f"{key}: {text}")
    return tuple(dict.fromkeys(out))[:60]


def _weight(card: Card) -> int:
    return card.weight


_cards: Memo[tuple[str, str, int], Card] = Memo(CARD_CACHE_BYTES, weight=_weight)


def read_card(
    entry: FileEntry, opener: Callable[[FileEntry], BinaryIO], render: Callable[[str], Rendered]
) -> Card:
    """The rendered card of a Markdown entry (a README.md, or any ``*.md`` file page), read
    with ``opener`` (the store's), rendered by ``render`` (a
    :class:`~._card_worker.CardRenderer`'s) and cached per blob version (its path in the
    store, ETag and size), once even when several pages ask at once. What ``render``
    raises (the renderer is busy) is raised here and nothing is kept."""

    def compute() -> Card:
        with opener(entry) as f:
            return _read_card(f.read(MAX_CARD_BYTES + 1), render)

    key = (str(entry.source), entry.etag, entry.size)
    return _cards.get_or_compute(key, compute, exclusive=True)


def as_text(raw: bytes, note: str) -> Card:
    """A card shown as text only (escaped, inside ``<pre>``), with ``note``: what a page
    shows when its card is not rendered for this view (not kept)."""
    card = _read_card(raw, _not_rendered)
    return Card(card.html, card.front_matter, card.tags, (*card.notes, note), weight=card.weight)


def _not_rendered(body: str) -> Rendered:
    return Rendered(None)


def _as_text(body: str) -> str:
    return f"<pre>{html.escape(body, quote=False)}</pre>"


def _read_card(raw: bytes, render: Callable[[str], Rendered] = render_card_body) -> Card:
    notes: list[str] = []
    if len(raw) > MAX_CARD_BYTES:
        raw = raw[:MAX_CARD_BYTES]
        notes.append(f"the card is longer than {format_size(MAX_CARD_BYTES)}: shown cut")
    text = raw.decode("utf-8", errors="replace")
    front, body, problem = split_front_matter(text)
    if problem:
        notes.append(problem)
    tags = card_tags(front)

    def shown_as_text(why: str) -> Card:
        if why:
            notes.append(f"{why}: shown as text")
        page = _as_text(body)
        return Card(page, front, tags, tuple(notes), weight=len(raw) + len(page.encode()))

    if body.count("[") > MAX_CARD_BRACKETS:
        return shown_as_text(f"the card has more than {MAX_CARD_BRACKETS} '['")
    if sum(body.count(c) for c in "*_~") > MAX_CARD_EMPHASIS:
        return shown_as_text(f"the card has more than {MAX_CARD_EMPHASIS} '*', '_' and '~'")
    done = render(body)
    if done.html is None:
        return shown_as_text(done.problem)
    weight = len(raw) + len(done.html.encode())
    return Card(done.html, front, tags, tuple(notes), done.images, weight)
