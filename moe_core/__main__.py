"""``python -m moe_core``: the same as the ``moe-core`` command."""

import sys

from moe_core.cli import main

sys.exit(main())
