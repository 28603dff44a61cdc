"""``python -m timeline.cli``: the same entry point as the ``timeline`` command."""

import sys

from timeline.cli import main

sys.exit(main())
