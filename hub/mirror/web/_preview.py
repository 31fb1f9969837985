"""Text previews of repo files, highlighted by Pygments, and the stylesheet for them.

A preview shows at most :data:`MAX_PREVIEW_BYTES` of a file (the rest is a
download away), only when those bytes are UTF-8 text without NUL. The lexer is
picked by the file name alone (``config.json`` is JSON, ``README.md`` Markdown,
``*.yaml`` YAML, ...) and only among :data:`HIGHLIGHTED` (the formats of model
repos; anything else is plain text): guessing from the content would run every
lexer on untrusted bytes, and fewer lexers are fewer regular expressions a
hostile file can make slow. Markdown's fenced code is not handed to other
lexers for the same reason. Pygments escapes all text it writes
and marks tokens with classes only, so the page's CSP (no inline style) holds;
the colours come from :func:`highlight_css`, light and dark.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, BinaryIO

from .._memo import Memo

#: Held while Pygments picks a lexer and makes a formatter: several pages' first previews
#: at once made its lazy loader raise ImportError (a 500) on a fresh worker.
_PYGMENTS_LOADING = threading.Lock()

if TYPE_CHECKING:
    from .._index import FileEntry

#: The most bytes of a file a preview shows (and Pygments lexes): about 0.1 s of
#: lexing and 1 MB of HTML for JSON.
MAX_PREVIEW_BYTES = 128 * 1024
#: Bytes of previews kept per worker (HTML and text): a file's preview is lexed once per
#: blob version, not once per view (128 KiB of Markdown is about a second of Pygments).
PREVIEW_CACHE_BYTES = 32 * 1024 * 1024
#: Lexers used (by their first Pygments alias); other file types show as plain text.
HIGHLIGHTED = frozenset(
    {"json", "yaml", "markdown", "python", "toml", "ini", "bash", "xml", "text"}
)
#: Files with these suffixes are never previewed (their pages show other things).
NO_PREVIEW_SUFFIXES = (".safetensors",)
LIGHT_STYLE = "default"
DARK_STYLE = "github-dark"


@dataclass(frozen=True)
class Preview:
    """A file's preview: highlighted HTML (safe), or why there is none."""

    html: str | None
    language: str | None = None
    cut: bool = False  # the file is longer than what is shown
    reason: str | None = None  # why there is no preview
    text: str = ""  # the text shown


def _formatter() -> Any:
    from pygments.formatters.html import HtmlFormatter  # not the lazy pygments.formatters

    return HtmlFormatter(cssclass="highlight", wrapcode=True)


def text_preview(name: str, f: BinaryIO) -> Preview:
    """The preview of a file named ``name`` read from ``f`` (at most the bound, plus one)."""
    if name.endswith(NO_PREVIEW_SUFFIXES):
        return Preview(None, reason="weights: see the tensors below")
    raw = f.read(MAX_PREVIEW_BYTES + 1)
    cut = len(raw) > MAX_PREVIEW_BYTES
    raw = raw[:MAX_PREVIEW_BYTES]
    if b"\x00" in raw:
        return Preview(None, reason="binary file: no preview")
    try:  # a cut may split a character: only the end may be incomplete
        text = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)
    except UnicodeDecodeError:
        return Preview(None, reason="not UTF-8 text: no preview")
    from pygments import highlight
    from pygments.lexers import get_lexer_for_filename
    from pygments.lexers.special import TextLexer
    from pygments.util import ClassNotFound

    with _PYGMENTS_LOADING:  # its lazy loading of lexers and formatters is not thread-safe
        try:
            lexer = get_lexer_for_filename(name.rsplit("/", 1)[-1], stripnl=False)
        except ClassNotFound:
            lexer = None
        if lexer is None or lexer.aliases[0] not in HIGHLIGHTED:
            lexer = TextLexer(stripnl=False)
        elif lexer.aliases[0] == "markdown":
            lexer = get_lexer_for_filename("x.md", stripnl=False, handlecodeblocks=False)
        formatter = _formatter()
    html = highlight(text, lexer, formatter)
    return Preview(html, lexer.name, cut, text=text)


@lru_cache(maxsize=1)
def highlight_css() -> bytes:
    """Pygments' token colours for ``.highlight``: light, and dark under
    ``prefers-color-scheme: dark``."""
    from pygments.formatters.html import HtmlFormatter  # not the lazy pygments.formatters

    light = HtmlFormatter(style=LIGHT_STYLE).get_style_defs(".highlight")
    dark = HtmlFormatter(style=DARK_STYLE).get_style_defs(".highlight")
    css = f"{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"
    return css.encode("utf-8")


def _weight(preview: Preview) -> int:
    return len(preview.html or "") + len(preview.text) + 256


_previews: Memo[tuple[str, str, int, str], Preview] = Memo(PREVIEW_CACHE_BYTES, weight=_weight)


def file_preview(entry: FileEntry, opener: Callable[[FileEntry], BinaryIO]) -> Preview:
    """:func:`text_preview` of ``entry`` read with ``opener`` (the store's), kept per blob
    version and file name (the name picks the lexer), once even when several pages ask at
    once; an ``OSError`` keeps nothing."""

    def compute() -> Preview:
        with opener(entry) as f:
            return text_preview(entry.path, f)

    key = (str(entry.source), entry.etag, entry.size, entry.path.rsplit("/", 1)[-1])
    return _previews.get_or_compute(key, compute, exclusive=True)
