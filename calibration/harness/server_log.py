"""An attached server's saved log (``calibrate run --attach URL --server-log PATH``), kept in the bundle.

``calibrate fit`` opens only regular files inside the bundle folder (calibration/fit/inputs.py: an
uploaded bundle must not make it read the server's files), so the path the user gave, usually absolute
and on the measuring machine, would be refused there even on that machine.  The runner therefore copies
the log into the bundle when it records the attachment, and again when the run ends or is interrupted
(the server goes on logging while it is measured), and the manifest names the copy.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from calibration.harness.bundle import BundleError

#: The copy's cap.  A fit reads the first 200 kB of the log (``device_config=cpu``) and the run reads its
#: start-up lines, all near the head; a normal log is far smaller than this, a log of days of serving
#: need not be kept whole.  Above the cap the copy keeps the head (start-up) and the newest tail (this
#: run), with a line saying how much was left out between them.
MAX_COPY_BYTES = 64 * 2**20
HEAD_BYTES = 2**20
FIX = "save the server's log to a regular file first (e.g. `kubectl logs POD > server.log`) and pass that file"


def copy_name(index: int) -> str:
    """The copy's name in the bundle folder for the ``index``-th attachment (one per run of the bundle).

    Not ``server-<n>.log``: launch mode numbers its logs by counting those files."""
    return f"attached-server-{index}.log"


def check_server_log(value: str) -> None:
    """Refuse ``--server-log value`` unless it is a regular file (BundleError, exit 2), before any run.

    ``os.stat`` never blocks; opening a FIFO to read it waits for a writer, so it would hang the run."""
    try:
        mode = os.stat(value).st_mode
    except OSError as exc:
        raise BundleError(f"--server-log {value}: {exc.strerror or exc}; {FIX}") from None
    if not stat.S_ISREG(mode):
        raise BundleError(
            f"--server-log {value}: not a regular file (a folder, pipe or device), and reading a "
            f"pipe would block the run; {FIX}"
        )


def read_bounded(src: str | Path) -> bytes:
    """The log's current contents, at most about MAX_COPY_BYTES (head and tail above that).

    Opened without blocking, and checked again on the open file: a path swapped for a FIFO after
    :func:`check_server_log` is refused, not waited on.  Raises BundleError or OSError."""
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as fh:  # owns fd from here
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"--server-log {src}: no longer a regular file; {FIX}")
        if st.st_size <= MAX_COPY_BYTES:
            return fh.read(MAX_COPY_BYTES)  # bounded even if the server wrote more since the fstat
        head = fh.read(HEAD_BYTES)
        tail_bytes = MAX_COPY_BYTES - HEAD_BYTES
        fh.seek(st.st_size - tail_bytes - 1)  # one byte before: was the tail's start a line's?
        tail = fh.read(tail_bytes + 1)
    cut = tail.find(b"\n") + 1  # start the tail at a whole line
    skipped = st.st_size - HEAD_BYTES - tail_bytes - 1 + cut
    note = f"\n[epdsim: {skipped} bytes of the server log left out here, the copy keeps {MAX_COPY_BYTES} bytes]\n"
    return head + note.encode() + tail[cut:]


def copy_server_log(src: str | Path, folder: Path, name: str) -> bytes:
    """Copy the log ``src`` (see :func:`read_bounded`) to ``folder/name``; returns what was copied.

    Written beside and renamed over, so an interruption mid-copy leaves the previous copy whole."""
    data = read_bounded(src)
    dest = Path(folder) / name
    tmp = dest.with_name(name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, dest)
    return data
