"""``python -m timeline``: the same as the ``timeline`` command."""

import sys

from timeline.cli import main

sys.exit(main())
