"""`epdsim --help` and the argument parser load none of the heavy libraries (pandas, Plotly,
Streamlit, pyarrow): they cost ~0.3-0.9 s of start-up and only the commands that need them import them."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("pandas", "plotly", "streamlit", "pyarrow")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    return run.stdout.split()


def test_building_the_parser_imports_no_heavy_library():
    assert _loaded_after("from simulator.cli.commands import build_parser\nbuild_parser()") == []


def test_help_imports_no_heavy_library():
    code = (
        "import contextlib, io\nfrom simulator.cli.commands import main\nf = io.StringIO()\n"
        "with contextlib.redirect_stdout(f):\n    try:\n        main(['--help'])\n"
        "    except SystemExit:\n        pass\n"
        "assert 'simulate' in f.getvalue()"
    )
    assert _loaded_after(code) == []


def test_the_probe_sees_an_imported_library():
    """The check above would pass vacuously if the probe could not see imports."""
    assert "pandas" in _loaded_after("import pandas")
