"""cmh.hub: mirror store and server, resolver, pruning (imported as ``cmh.hub``).

Four subpackages over one cache core (docs/architecture.md):
:mod:`cmh.hub.cache` (the stock cache layout, locks, usage records, blob
checks), :mod:`cmh.hub.resolver` (resolve, hold, the HTTP client, downloads,
the transformers hook), :mod:`cmh.hub.mirror` (store import, index, scrub,
the ``cmh serve`` app) and :mod:`cmh.hub.prune` (scan, plan, execute). Each
one's ``__init__`` is its face; the modules behind it are private (``_name.py``).

The resolver's public API is exported here, lazily, so ``import cmh.hub``
stays light (no HTTP stack, no torch, no transformers):

>>> import cmh.hub
>>> res = cmh.hub.resolve("org/model")                    # doctest: +SKIP
>>> model = AutoModel.from_pretrained(res.path)           # doctest: +SKIP
>>> cmh.hub.install()   # route transformers' downloads through the resolver  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cmh.hub.resolver import __all__ as _resolver

from ._lazy import lazy_exports

if TYPE_CHECKING:
    # Typed view of the lazy exports below.
    from cmh.hub.resolver import *  # noqa: F403

__all__: list[str] = []
__all__ += _resolver

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, "resolver"), globals())
