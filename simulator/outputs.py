"""Output paths checked before a run, so that minutes of simulation never end in "cannot write".

:func:`check_output` refuses, before anything runs, what can be known without writing: a folder
where a file goes and the reverse, a device, pipe or socket (``/dev/full``), a parent that is a
file, a place this user may not write.  What only a write reveals (a disk that fills during the
run) is named afterwards by :func:`write_failed`.  Every message names the option, the path and
the fix.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class OutputPathError(OSError):
    """An output path that cannot be written; the message names the option, the path and the fix.  An
    OSError, so that a command whose user errors include OSError prints it as one (exit 2)."""


def check_output(path, option: str, *, folder: bool, error: type[Exception] = ValueError) -> Path:
    """``path`` as a Path once it is known that ``option`` can write there: a folder of output files
    (``folder``, made if missing) or one file; raises ``error`` naming option, path and fix."""
    p = Path(path)
    where = f"{option} {p}"
    kind = "folder of output files" if folder else "file to write"
    try:
        if p.exists():
            if folder and not p.is_dir():
                raise error(f"{where}: is a file, not a folder; give a folder for the output files")
            if not folder and p.is_dir():
                raise error(f"{where}: is a folder; give the path of the file to write")
            if not folder and not p.is_file():
                raise error(
                    f"{where}: is not a regular file (a device, pipe or socket); give the path of a file to write"
                )
            target = p
        else:
            target = next(a for a in p.parents if a.exists())
            if not target.is_dir():
                raise error(f"{where}: {target} is a file, not a folder; choose another path for the {kind}")
        mode = os.W_OK | (os.X_OK if target.is_dir() else 0)
        if not os.access(target, mode):
            raise error(
                f"{where}: {target} is not writable by this user; check its permissions or choose "
                f"another path for the {kind}"
            )
    except error:  # a refusal above (``error`` may itself be an OSError)
        raise
    except OSError as exc:  # a name too long, a parent that cannot be searched
        raise error(f"{where}: cannot be written ({exc.strerror or exc}); choose another path") from None
    return p


def write_failed(exc: OSError, option: str, path) -> str:
    """The message for an OSError met while writing ``option``'s ``path`` after a run."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    hint = "the disk is full: free some space or choose another path" if full else "choose another path"
    return f"{option} {path}: writing failed ({exc.strerror or exc}); {hint}"
