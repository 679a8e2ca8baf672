"""Loading and validating the hardware database (:class:`hwdb.db.HardwareDB`) from its folders.

The database is the union of the files shipped in ``hwdb/data`` and any user folders given to
:func:`load` (later folders override earlier ones by name).  Layout of a folder::

    gpus/<name>.yaml          -> hwdb.schema.GPU
    links/<name>.yaml         -> hwdb.schema.Link
    models/<name>/config.json + epdsim.yaml (sidecar, optional for user models)
    profiles/<name>.yaml      -> calibration profile (hwdb.profiles.Profile)
    engines/<name>.yaml       -> hwdb.engine_schema.EngineProfile
    connectors/<name>.yaml    -> hwdb.schema.Connector (KV-transfer connectors)
    networks/<name>.yaml      -> hwdb.schema.NetworkLayout (a node type's GPU NICs: link, count, rate)
    moe_kernels/<name>.yaml   -> hwdb.moe.MoeKernels (measured fused-MoE kernel curves of a GPU and engine)
    gdn_kernels/<name>.yaml   -> hwdb.gdn.GdnCurve (measured Gated-DeltaNet kernel curves of a GPU and engine)
    mla_kernels/<name>.yaml   -> hwdb.mla.MlaCurve (measured MLA attention kernel curves of a GPU and engine)

Every error is a :class:`HwdbError` naming the file, the field and the expected form.  :func:`load`
parses each folder list once per process (see :func:`_stamp`); every call returns its own deep copy,
so no caller can change what another one sees.
"""

from __future__ import annotations

import collections
import copy
import functools
import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from hwdb.db import DATA_DIR, HardwareDB, ModelEntry, load_model_dir, name_key
from hwdb.engine_schema import EngineProfile
from hwdb.files import HwdbError, parse_file
from hwdb.gdn import GdnCurve
from hwdb.mla import MlaCurve
from hwdb.moe import MoeKernels
from hwdb.profiles import Profile
from hwdb.schema import GPU, Connector, Link, NetworkLayout

FILE_SCHEMAS: dict[str, type[BaseModel]] = {
    "gpus": GPU,
    "links": Link,
    "profiles": Profile,
    "engines": EngineProfile,
    "connectors": Connector,
    "networks": NetworkLayout,
    "moe_kernels": MoeKernels,
    "gdn_kernels": GdnCurve,
    "mla_kernels": MlaCurve,
}
WHAT = {
    "gpus": "GPU",
    "moe_kernels": "MoE kernel table",
    "gdn_kernels": "linear-attention kernel table",
    "mla_kernels": "MLA kernel table",
    "storage": "storage path",
    "image": "container image",
    "startup": "start-up coefficient set",
    "scale": "start-up range set",
}


def _aliases(item) -> tuple[str, ...]:
    return tuple(getattr(item, "aliases", ()) or getattr(getattr(item, "sidecar", None), "aliases", ()))


def _with_aliases(item, aliases: tuple[str, ...]):
    if isinstance(item, ModelEntry):
        return replace(item, sidecar=item.sidecar.model_copy(update={"aliases": aliases}))
    return item.model_copy(update={"aliases": aliases}) if hasattr(item, "aliases") else item


def _over_earlier(kind: str, table: dict, item, path: Path, origins: dict, notes: list[str]):
    """``item`` from a later folder, keeping the aliases of an earlier entry of the same name that it replaces
    (so that ``--gpu H100`` still finds the H100, now the user's), with a note in ``notes`` when it replaces one
    or takes a name another entry answers to."""
    what = WHAT.get(kind, kind[:-1])
    old = table.get(item.name)
    if old is not None:
        kept = tuple(dict.fromkeys((*_aliases(item), *_aliases(old))))
        where = origins.get((kind, item.name), "an earlier folder")
        names = f" (its names {', '.join(kept)} now lead to this one)" if kept else ""
        notes.append(
            f"{path} replaces the {what} '{item.name}' of {where}: every answer that uses it changes{names}"
            f"; give it another name to add a {what} beside it instead"
        )
        return _with_aliases(item, kept)
    mine = {name_key(n) for n in (item.name, *_aliases(item))}
    clash = next((k for k, v in table.items() if mine & {name_key(n) for n in (k, *_aliases(v))}), None)
    if clash is not None:
        notes.append(
            f"{path}: the {what} '{item.name}' answers to a name of the {what} '{clash}' of "
            f"{origins.get((kind, clash), 'an earlier folder')}; that name may now find either: give it "
            "names of its own"
        )
    return item


def read_kind(
    folder: Path,
    kind: str,
    parse: Callable[[Path], Any],
    tables: dict[str, dict],
    origins: dict,
    notes: list[str],
    table_of: Callable[[Any], str] | None = None,
) -> None:
    """``folder/<kind>/*.yaml`` parsed (``parse(path)``) into ``tables[table_of(item) or kind]`` by :func:`load`'s
    rules: a name once per folder and table; a later folder's entry replaces an earlier one's, with a note."""
    here: dict = {}
    for path in sorted((folder / kind).glob("*.yaml")):
        item = parse(path)
        key = table_of(item) if table_of else kind
        if (key, item.name) in here:
            what = key[:-1] if key in FILE_SCHEMAS else WHAT.get(key, key[:-1])
            raise HwdbError(
                f"{path}: field 'name': {what} '{item.name}' is also defined in "
                f"{here[key, item.name]}; one folder may define a name once: rename or remove one"
            )
        here[key, item.name] = path
        tables[key][item.name] = _over_earlier(key, tables[key], item, path, origins, notes)
        origins[item.name] = origins[key, item.name] = path


def load_kind(
    kind: str,
    parse: Callable[[Path], Any],
    user_dirs: Iterable[str | Path] = (),
    table_of: Callable[[Any], str] | None = None,
) -> tuple[dict[str, dict], tuple[str, ...]]:
    """``<folder>/<kind>/*.yaml`` of the shipped and the user folders (:func:`hwdb_folders`) by :func:`read_kind`,
    not cached: (the tables, by default ``kind``'s alone; the notes)."""
    tables: dict[str, dict] = collections.defaultdict(dict)
    origins: dict = {}
    notes: list[str] = []
    for folder in hwdb_folders(user_dirs):
        read_kind(folder, kind, parse, tables, origins, notes, table_of)
    return dict(tables), tuple(notes)


def _load_folder(folder: Path, tables: dict[str, dict], origins: dict, notes: list[str]) -> None:
    for kind, schema in FILE_SCHEMAS.items():
        read_kind(folder, kind, functools.partial(parse_file, schema=schema), tables, origins, notes)
    for path in sorted((folder / "models").glob("*")):
        if path.is_dir():
            m = load_model_dir(path)
            tables["models"][m.name] = _over_earlier("models", tables["models"], m, path, origins, notes)
            origins["models", m.name] = path


def hwdb_folders(user_dirs: Iterable[str | Path] = ()) -> list[Path]:
    """The shipped folder, then ``user_dirs``; a user folder that is a file or missing raises HwdbError."""
    folders = [DATA_DIR, *map(Path, user_dirs)]
    for folder in folders:
        if folder.is_file():
            raise HwdbError(
                f"hwdb folder '{folder}' is a file, not a folder. Give the folder that holds gpus/, "
                f"links/ and models/ (--hwdb DIR, or the hwdb list of the scenario or plan request)."
            )
        if not folder.is_dir():
            raise HwdbError(
                f"hwdb folder '{folder}' does not exist. Create it or fix the path (--hwdb DIR, or the "
                f"hwdb list of the scenario or plan request)."
            )
    return folders


def _stamp(folders: list[Path]) -> tuple:
    """What a cached database depends on: each folder's resolved path and every file under it with its
    modification time and size, so an edited, added or removed file means a fresh load.  User folders'
    files also count by content: a file rewritten within the clock's granularity (a few ms) with the
    same size keeps its time stamp, and user folders are edited while a process runs (app, tests)."""
    out = []
    for folder in folders:
        root = str(folder.resolve())
        shipped = root == str(DATA_DIR.resolve())
        files: list[tuple[str, int | None, int | None, bytes | None]] = []
        for base, dirs, names in os.walk(root):
            dirs.sort()
            for n in sorted(names):
                path = os.path.join(base, n)
                try:
                    st = os.stat(path)
                    digest = None if shipped else hashlib.blake2b(Path(path).read_bytes(), digest_size=16).digest()
                    files.append((path, st.st_mtime_ns, st.st_size, digest))
                except OSError:  # e.g. a dangling link: the load itself reports it if it matters
                    files.append((path, None, None, None))
        out.append((root, tuple(files)))
    return tuple(out)


# Parsed databases of this process by _stamp: a simulation, a plan candidate or an app rerun needs the database,
# and parsing ~60 YAML files and the model configs took 0.04-0.35 s each time.  A few entries suffice.
_CACHE: dict[tuple, HardwareDB] = {}
_CACHE_ENTRIES = 8


def load(user_dirs: Iterable[str | Path] = ()) -> HardwareDB:
    """Load the shipped database plus user folders (later folders win on name clashes).

    Returns a deep copy of the process's cached database for these folders (the copy costs ~5 ms,
    a parse 40 ms with libyaml and ~300 ms without)."""
    folders = hwdb_folders(user_dirs)
    key = _stamp(folders)
    db = _CACHE.get(key)
    if db is None:
        db = _load(folders)
        if len(_CACHE) >= _CACHE_ENTRIES:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = db
    return copy.deepcopy(db)


def _load(folders: list[Path]) -> HardwareDB:
    tables: dict[str, dict] = {kind: {} for kind in (*FILE_SCHEMAS, "models")}
    origins: dict = {}
    notes: list[str] = []
    for folder in folders:
        _load_folder(folder, tables, origins, notes)
    db = HardwareDB(**tables, notes=tuple(notes))
    links = tables["links"]
    for g in tables["gpus"].values():
        for fld in ("intra_node_link", "scale_out_link"):
            ref = getattr(g, fld)
            if ref is not None and ref not in links:
                raise HwdbError(
                    f"{origins.get(g.name, 'GPU ' + repr(g.name))}: field '{fld}': link '{ref}' "
                    f"is not defined in links/. Known: {sorted(links)}"
                )
    for lay in tables["networks"].values():
        where = origins.get(lay.name, f"network {lay.name!r}")
        if lay.fabric not in links:
            raise HwdbError(
                f"{where}: field 'fabric': link '{lay.fabric}' is not defined in links/. Known: {sorted(links)}"
            )
        bad = [g for g in lay.gpus if g not in tables["gpus"]]
        if bad:
            raise HwdbError(
                f"{where}: field 'gpus': {bad} not defined in gpus/ (use canonical names). "
                f"Known: {sorted(tables['gpus'])}"
            )
    return db
