"""``python -m cmh``: the ``cmh`` command line."""

from cmh.cli.main import main

main()
