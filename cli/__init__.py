"""The ``cmh`` command line (imported as ``cmh.cli``).

Subcommands live in their own modules and are imported only when run, so
``cmh --version`` and ``cmh verify --help`` never import torch,
transformers or the hub code.
"""
