"""``python -m simulator.cli``: the ``epdsim`` command."""

import sys

from simulator.cli import main

sys.exit(main())
