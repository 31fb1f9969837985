"""Which images of a rendered card come from other sites (the pages' CSP blocks them).

The pages load nothing from elsewhere (``img-src 'self' data:``), so an image a
card takes from another site shows as broken; the repo page says so and links
to each one instead. Read from the card's rendered HTML with the standard
library's parser (no regular expression over HTML), once, when the card is rendered
(:func:`~._cards.render_card_body`): the result is kept with the card's HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urlsplit

#: Images listed on the page (the rest are counted).
MAX_LISTED = 20


@dataclass(frozen=True)
class ForeignImages:
    """A card's images from other sites: how many, their hosts, the first few URLs."""

    count: int
    hosts: tuple[str, ...]
    urls: tuple[str, ...]


#: A card without images from other sites (or shown as text).
NO_IMAGES = ForeignImages(0, (), ())


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            src = dict(attrs).get("src")
            if src:
                self.sources.append(src)


def foreign_images(card_html: str) -> ForeignImages:
    """The ``<img>`` of ``card_html`` whose URL names a host (``http(s)://`` or ``//``)."""
    parser = _Images()
    parser.feed(card_html)
    parser.close()
    urls = [s for s in parser.sources if urlsplit(s).netloc]
    hosts = tuple(dict.fromkeys(urlsplit(u).netloc for u in urls))
    return ForeignImages(len(urls), hosts, tuple(urls[:MAX_LISTED]))
