"""``python -m cmh``: the ``cmh`` command line."""

from cmh.cli.main import main

if __name__ == "__main__":
    main()
