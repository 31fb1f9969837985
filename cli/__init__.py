"""The ``cmh`` command line (imported as ``cmh.cli``).

Its public module is :mod:`cmh.cli.main` (``main``, the console script
``cmh.cli.main:main`` that ``python -m cmh`` runs too, and the click group
``cli``). Subcommands live in private modules (``_name.py``) imported only when
run, so ``cmh --version`` and ``cmh verify --help`` never import torch,
transformers or the hub code.
"""

from __future__ import annotations

__all__: list[str] = []
