"""``python -m pathways.cli``: the ``pathways`` command."""

import sys

from pathways.cli import main

sys.exit(main())
