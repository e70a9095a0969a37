"""``python -m precision_lab``: the ``precision-lab`` command line (:mod:`precision_lab.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
