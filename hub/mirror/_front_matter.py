"""A model card's YAML front matter: found, parsed and bounded once for the API and the pages.

The block is the first match of the stock client's
:data:`huggingface_hub.repocard.REGEX_YAML_BLOCK`, parsed by PyYAML's safe
loader (libyaml when built in) and written out as JSON data (dates as ISO
text, keys as strings, bounded in nodes and depth). ``mirror.derived`` makes
the Hub's card fields from it; ``mirror.web.cards`` shows it as tags and
renders the body that follows it.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

#: A card's front matter block: the pattern of ``huggingface_hub.repocard.REGEX_YAML_BLOCK``
#: (a test checks they are equal), here because importing ``repocard`` imports ``hf_api``
#: and costs every ``cmh serve`` 0.3 s of start-up.
YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")

#: A few YAML aliases can stand for a tree of billions of nodes once written
#: out as JSON; a card whose data is larger than this is ignored.
MAX_CARD_NODES = 20_000
MAX_CARD_DEPTH = 32
#: Front matter longer than this is not parsed (a card's metadata is a few KiB).
MAX_FRONT_MATTER_BYTES = 64 * 1024

_IGNORED = ": its data is ignored"
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built in


@dataclass(frozen=True)
class FrontMatter:
    """``data``: the block as JSON data (``None`` without a usable one); ``body``: the text after
    the block (all of it without one); ``problem``: why a block's data is ignored."""

    data: dict[str, Any] | None
    body: str
    problem: str | None = None


class _TooLarge(ValueError):
    pass


def _plain(value: Any, budget: list[int], depth: int = 0) -> Any:
    """``value`` as JSON data: dates as ISO text, keys as strings, bounded in size.

    Written here rather than ``json.dumps(default=str)``, which would follow
    shared YAML nodes without bound and write non-finite floats as invalid JSON.
    """
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_CARD_DEPTH:
        raise _TooLarge
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): _plain(v, budget, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [_plain(v, budget, depth + 1) for v in items]
    return str(value)


def read_front_matter(text: str) -> FrontMatter:
    """The front matter of a card's text (module docstring); never raises for bad input."""
    match = YAML_BLOCK.search(text)
    if match is None:
        return FrontMatter(None, text)
    body = text[match.end() :]
    block = match.group(2)
    if len(block.encode("utf-8", "surrogatepass")) > MAX_FRONT_MATTER_BYTES:
        limit = MAX_FRONT_MATTER_BYTES // 1024
        return FrontMatter(None, body, f"the card's front matter is over {limit} KiB{_IGNORED}")
    try:
        if _has_alias(block):
            return FrontMatter(None, body, f"the card's front matter uses YAML aliases{_IGNORED}")
        data = yaml.load(block, Loader=_SafeLoader)
    except Exception:  # untrusted: YAMLError, RecursionError, ValueError (huge ints), ...
        return FrontMatter(None, body, f"the card's front matter is not valid YAML{_IGNORED}")
    if data is None:
        return FrontMatter(None, body)
    if not isinstance(data, dict):
        return FrontMatter(None, body, "the card's front matter is not a mapping")
    try:
        plain = _plain(data, [MAX_CARD_NODES])
    except (_TooLarge, RecursionError, ValueError, TypeError):
        return FrontMatter(None, body, f"the card's front matter is too large{_IGNORED}")
    assert isinstance(plain, dict)
    return FrontMatter(plain, body)


def _has_alias(block: str) -> bool:
    """Whether the YAML text uses an alias (``*name``): refused, since a few aliases can
    stand for billions of nodes; a card's metadata has no need of them."""
    return any(isinstance(t, yaml.AliasToken) for t in yaml.scan(block, Loader=_SafeLoader))
