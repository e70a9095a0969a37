"""``python -m precision_lab``: the ``precision-lab`` command line (:mod:`precision_lab.cli`)."""

import sys

from .cli import main

sys.exit(main())
