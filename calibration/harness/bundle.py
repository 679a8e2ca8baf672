"""Measurement bundle: a directory with a manifest and append-only JSONL records.

Layout::

    BUNDLE/
      manifest.json          what was measured, on what, with what (schema_version, hardware,
                             vllm/torch versions, model, engine args, command lines, launches,
                             start-up phases, plan of probe phases, time stamps, epdsim commit)
      records/<phase>.jsonl  one JSON object per line, appended and flushed one at a time:
                               {"kind": "phase_start", "segment": n, ...}
                               {"kind": "request", "id": ..., "model": ..., "ok": true, ...}
                               {"kind": "metrics", "segment": n, "histograms": ..., "counters": ...}
                               {"kind": "phase_done", ...}
      server-<n>.log         log of the n-th launched server (launch mode)
      model/                 the generated tiny model (launch mode with the default model)

A run killed at any point keeps every record written so far (each line is flushed before the
next request's record; a torn last line is ignored on reading and fenced off on the next append).
Resuming skips phases with a ``phase_done`` record, and inside an unfinished phase the request
ids that already have an ``ok`` record; a resumed phase gets a new ``segment`` number, with its
own metrics delta.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from calibration.harness.bundle_schema import FIX, PHASE_NAME, SCHEMA_VERSION, check_manifest, check_record
from simulator.inputs import read_text

MANIFEST = "manifest.json"
RECORDS = "records"
REQUIRED_MANIFEST_KEYS = ("schema_version", "created", "model", "mode", "plan")
RECORD_KINDS = ("phase_start", "request", "metrics", "phase_done", "note")
_WRITTEN = '{"kind":"'  # how every line the harness appends begins (compact JSON, kind first)


class BundleError(Exception):
    """A bundle that cannot be used as asked (missing, inconsistent, or from another model)."""


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


class Bundle:
    """An open bundle.  Create with :meth:`create`, open an existing one with :meth:`open`."""

    def __init__(self, path: Path, manifest: dict):
        self.path = Path(path)
        self.manifest = manifest

    # ----------------------------------------------------------------- creating and opening
    @classmethod
    def create(cls, path: str | Path, manifest: dict[str, Any]) -> Bundle:
        """Start a new bundle in ``path`` (absent or empty directory)."""
        path = Path(path)
        if (path / MANIFEST).exists() or (path.exists() and any((path / RECORDS).glob("*.jsonl"))):
            raise BundleError(f"{path} already holds a bundle; pass --resume to continue it, or choose another --out")
        m = dict(manifest)
        m.setdefault("schema_version", SCHEMA_VERSION)
        m.setdefault("created", now_iso())
        m.setdefault("launches", [])
        m.setdefault("runs", [])
        missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in m]
        if missing:
            raise BundleError(f"manifest lacks {', '.join(missing)}")
        (path / RECORDS).mkdir(parents=True, exist_ok=True)
        b = cls(path, m)
        b.write_manifest()
        return b

    @classmethod
    def open(cls, path: str | Path, validate_records: bool = True, complete: bool = False) -> Bundle:
        """Open and validate an existing bundle; :class:`BundleError` says what is wrong.

        ``complete``: every successful request record must also hold the measurements that
        ``calibrate show``, ``fit`` and ``validate`` read (see :mod:`calibration.harness.bundle_schema`)."""
        path = Path(path)
        mf = path / MANIFEST
        if not path.is_dir():
            raise BundleError(f"no bundle at {path}: not a directory")
        if not mf.exists():
            raise BundleError(f"{path} is not a measurement bundle: {MANIFEST} is missing")
        text = read_text(mf, BundleError, "bundle manifest")
        try:
            m = json.loads(text)  # NaN allowed: the harness writes it for unmeasured figures
        except json.JSONDecodeError as exc:
            raise BundleError(f"{mf} is not valid JSON: {exc}") from None
        except (ValueError, RecursionError) as exc:
            raise BundleError(f"{mf} cannot be read ({str(exc)[:160]})") from None
        if not isinstance(m, dict):
            raise BundleError(f"{mf} must hold a JSON object")
        if m.get("kind") == "pd_run":  # calibration/pd/bundle.py reads these
            raise BundleError(
                f"{path} is a PD bundle (written by `epdsim calibrate run --pd`), not a "
                f"colocated calibration bundle: summarise it with `epdsim calibrate show {path}` and "
                f"replay it with `epdsim calibrate validate {path} --profile HWDB_DIR`"
            )
        missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in m]
        if missing:
            raise BundleError(f"{mf} lacks {', '.join(missing)}; {FIX.removeprefix('fix: ')}")
        try:
            check_manifest(mf, m)
        except ValueError as exc:
            raise BundleError(str(exc)) from None
        if m["schema_version"] != SCHEMA_VERSION:
            raise BundleError(
                f"{mf} has schema_version {m['schema_version']!r}; this epdsim reads version "
                f"{SCHEMA_VERSION}: measure again with this epdsim, or read the bundle with the "
                f"epdsim that wrote it"
            )
        b = cls(path, m)
        if validate_records:
            b.validate(complete)
        b.settle_stale_runs()
        return b

    def settle_stale_runs(self) -> list[int]:
        """Mark ``interrupted`` the runs still ``running`` whose harness process is gone.

        A run killed with SIGKILL (or a crash, a lost machine) cannot write its end; the next reader
        on the same host sees that its process no longer exists (or is another process with the same
        id: the start time differs) and says so in the manifest.  Returns the indices settled; the
        manifest is rewritten when the folder is writable."""
        host = os.uname().nodename if hasattr(os, "uname") else None
        settled = []
        for i, r in enumerate(self.manifest.get("runs") or []):
            if r.get("status") != "running" or not r.get("pid") or r.get("hostname") != host:
                continue  # finished, from before pids were kept, or from another host: cannot tell
            if process_alive(r["pid"], r.get("proc_start")):
                continue
            r.update(
                status="interrupted",
                interrupted_by=f"found at {now_iso()} with its process {r['pid']} gone "
                f"(killed with SIGKILL, crashed, or the machine stopped)",
            )
            settled.append(i)
        if settled:
            try:
                self.write_manifest()
            except OSError:
                pass  # a read-only bundle: the status is corrected in memory only
        return settled

    # ----------------------------------------------------------------- manifest
    def write_manifest(self) -> None:
        """Atomic rewrite (temporary file + rename), so a kill never leaves half a manifest."""
        self.manifest["updated"] = now_iso()
        tmp = self.path / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2, sort_keys=False, default=str) + "\n")
        os.replace(tmp, self.path / MANIFEST)

    @property
    def model_name(self) -> str:
        return self.manifest["model"]["served_name"]

    def check_same_model(self, model: dict[str, Any]) -> None:
        """Refuse to add measurements of another model (or the same name with another config)."""
        mine = self.manifest["model"]
        diffs = [
            f"{k}: bundle {mine.get(k)!r}, server {model.get(k)!r}"
            for k in ("served_name", "max_model_len", "config_sha256")
            if mine.get(k) is not None and model.get(k) is not None and mine.get(k) != model.get(k)
        ]
        if diffs:
            raise BundleError(f"{self.path} was measured on another model; " + "; ".join(diffs))

    # ----------------------------------------------------------------- records
    def _file(self, phase: str) -> Path:
        if not PHASE_NAME.match(phase):
            raise BundleError(
                f"{self.path / RECORDS}: bad phase name {phase!r}; a phase name is letters, digits, "
                f"'_', '.' and '-', starting with a letter or digit: rename the phase"
            )
        return self.path / RECORDS / f"{phase}.jsonl"

    def append(self, phase: str, record: dict[str, Any]) -> None:
        """Append one record and flush it to the OS before returning."""
        if record.get("kind") not in RECORD_KINDS:
            raise BundleError(f"unknown record kind {record.get('kind')!r}")
        rec = {"kind": record["kind"], "phase": phase, **{k: v for k, v in record.items() if k != "kind"}}
        if rec["kind"] == "request":
            rec.setdefault("model", self.model_name)
        line = json.dumps(rec, separators=(",", ":"), default=_json_default, allow_nan=True)
        f = self._file(phase)
        with open(f, "ab") as fh:
            if fh.tell() > 0 and not _ends_with_newline(f):
                fh.write(b"\n")  # a torn line from a killed writer stays on its own line
            fh.write(line.encode() + b"\n")
            fh.flush()

    def records(self, phase: str, kind: str | None = None) -> list[dict]:
        return [rec for _, rec in self._lines(phase) if kind is None or rec.get("kind") == kind]

    def _lines(self, phase: str) -> list[tuple[int, dict]]:
        """(line number, record) for each record of ``phase``, without the torn line of a killed run."""
        f = self._file(phase)
        if not f.exists():
            return []
        out = []
        for n, line in enumerate(read_text(f, BundleError, "bundle record file", limit=None).splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                if _torn(line, exc):
                    continue
                raise BundleError(
                    f"{f} line {n}: not a JSON record ({exc.msg} at column {exc.colno}: "
                    f"{line[:60]!r}); each line is one JSON object. {FIX}"
                ) from None
            except (ValueError, RecursionError) as exc:
                raise BundleError(f"{f} line {n}: a record cannot be read ({str(exc)[:160]}); {FIX}") from None
            if not isinstance(rec, dict):
                raise BundleError(f"{f} line {n}: a record is a JSON {type(rec).__name__}, expected an object; {FIX}")
            if rec.get("kind") == "request" and not isinstance(rec.get("id"), str):
                raise BundleError(
                    f"{f} line {n}: a request record has id {rec.get('id')!r}; each request needs a string id. {FIX}"
                )
            out.append((n, rec))
        return out

    def phases(self) -> list[str]:
        """Phases in plan order, then any others found on disk."""
        planned = [p["name"] for p in self.manifest.get("plan", [])]
        on_disk = sorted(f.stem for f in (self.path / RECORDS).glob("*.jsonl"))
        return planned + [p for p in on_disk if p not in planned]

    def phase_done(self, phase: str) -> bool:
        return any(True for _ in self.records(phase, "phase_done"))

    def completed_ids(self, phase: str) -> set[str]:
        return {r["id"] for r in self.records(phase, "request") if r.get("ok")}

    def next_segment(self, phase: str) -> int:
        return len(self.records(phase, "phase_start"))

    def requests(self, phase: str, ok_only: bool = True) -> list[dict]:
        """Request records, the last one per id (a resumed phase may repeat a failed id)."""
        by_id: dict[str, dict] = {}
        for r in self.records(phase, "request"):
            if ok_only and not r.get("ok"):
                continue
            if r.get("ok") or r["id"] not in by_id:
                by_id[r["id"]] = r
        return list(by_id.values())

    def validate(self, complete: bool = False) -> None:
        """Every record file belongs to this bundle's model and holds records of known kinds and
        fields (``complete``: with every measurement, see :meth:`open`)."""
        for f in sorted((self.path / RECORDS).glob("*.jsonl")) if (self.path / RECORDS).exists() else []:
            phase = f.stem
            for n, rec in self._lines(phase):
                if rec.get("kind") not in RECORD_KINDS:
                    raise BundleError(
                        f"{f} line {n}: unknown record kind {rec.get('kind')!r}; the kinds are "
                        f"{', '.join(RECORD_KINDS)}. {FIX}"
                    )
                try:
                    check_record(f, n, rec, self.manifest.get("mode"), complete)
                except ValueError as exc:
                    raise BundleError(str(exc)) from None
                if rec.get("phase") not in (None, phase):
                    raise BundleError(f"{f}: a record of phase {rec.get('phase')!r} is in the file of phase {phase!r}")
                if rec["kind"] == "request" and rec.get("model") != self.model_name:
                    raise BundleError(
                        f"{f}: request {rec.get('id')!r} was measured on model "
                        f"{rec.get('model')!r}, but the manifest says {self.model_name!r}"
                    )


def proc_start(pid: int | str = "self") -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int, started: str | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, when ``started`` is known, is the process that had it."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = stat.rsplit(")", 1)[-1].split()
    if fields and fields[0] in ("Z", "X"):
        return False
    return started is None or proc_start(pid) == started


def _torn(line: str, exc: json.JSONDecodeError) -> bool:
    """Whether ``line`` is what a writer killed mid-line leaves: the start of a record, cut short (it
    is skipped); any other line that is not JSON is an error."""
    line = line.rstrip()
    if not (line.startswith(_WRITTEN) or _WRITTEN.startswith(line)):
        return False
    return not line.endswith("}") or exc.pos >= len(line) or exc.msg.startswith("Unterminated string")


def _ends_with_newline(f: Path) -> bool:
    with open(f, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _json_default(o):
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
