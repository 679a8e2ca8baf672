"""The ``epdsim`` command line: the top of the program, above ``app`` and ``calibration``.

``main`` builds the parser and dispatches; each family of subcommands lives in its own module
(``simulate``, ``ops``, ``plan``, ``regress``, ``epd``) and is imported only when its subparser is
added or run, so ``epdsim --help`` stays fast.  Nothing below this package imports it.
"""

from simulator.cli.commands import main

__all__ = ["main"]
