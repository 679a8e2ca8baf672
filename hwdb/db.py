"""Loading and validating the hardware database.

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from hwdb.engine_schema import EngineProfile
from hwdb.files import HwdbError, parse_file
from hwdb.gdn import GdnCurve
from hwdb.hf_config import ConfigError, arch_from_config
from hwdb.mla import MlaCurve
from hwdb.models import ModelArch
from hwdb.moe import MoeCurve, MoeKernels
from hwdb.profiles import Profile, ProfileMatch, version_matches
from hwdb.schema import GPU, Connector, Link, ModelSidecar, NetworkLayout
from simulator.inputs import read_json

DATA_DIR = Path(__file__).parent / "data"


def _norm(name: str) -> str:
    return name.lower().replace("-", "_")


def find(kind: str, table: dict, name: str, fix: str):
    """The entry of ``table`` called ``name``: exact key first, then any key or alias equal up to case
    and '-' vs '_'.  Unknown names raise HwdbError listing the known ones and ``fix``."""
    if name in table:
        return table[name]
    low = _norm(name)
    for key, item in table.items():
        aliases = getattr(item, "aliases", None)
        if aliases is None and hasattr(item, "sidecar"):
            aliases = item.sidecar.aliases
        if any(_norm(n) == low for n in (key, *(aliases or ()))):
            return item
    raise HwdbError(f"unknown {kind} '{name}'. Known {kind}s: {', '.join(sorted(table))}. {fix}")


@dataclass(frozen=True)
class ModelEntry:
    """A model: its verbatim config, its sidecar and the derived architecture."""

    name: str
    config: dict
    sidecar: ModelSidecar
    arch: ModelArch
    path: Path


def load_model_dir(path: Path, name: str | None = None) -> ModelEntry:
    """Load a model folder (``config.json`` plus optional ``epdsim.yaml``) or a bare config.json."""
    path = Path(path)
    if not path.exists():
        raise HwdbError(
            f"{path}: no such file or folder. Point --model at a Hugging Face model folder, its "
            f"config.json, or a model name (epdsim hw list models)."
        )
    cfg_path = path if path.is_file() else path / "config.json"
    if not cfg_path.exists():
        raise HwdbError(
            f"{path}: no config.json found. Point --model at a Hugging Face model folder or its config.json."
        )
    cfg = read_json(cfg_path, HwdbError, "model config.json")
    folder = cfg_path.parent
    side_path = folder / "epdsim.yaml"
    default_name = name or (folder.name if cfg_path.name == "config.json" else cfg_path.stem)
    if side_path.exists():
        sidecar = parse_file(side_path, ModelSidecar)
    else:
        sidecar = ModelSidecar(name=default_name, source=f"user config {cfg_path}")
    try:
        arch = arch_from_config(cfg, sidecar.name)
    except ConfigError as exc:
        raise HwdbError(f"{cfg_path}: {exc}") from None
    except (TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as exc:
        raise HwdbError(
            f"{cfg_path}: not a usable model config ({type(exc).__name__}: {str(exc)[:200]}); "
            f"compare it with the config.json of a Hugging Face model"
        ) from None
    return ModelEntry(sidecar.name, cfg, sidecar, arch, folder)


@dataclass(frozen=True)
class HardwareDB:
    """GPUs, links, models and calibration profiles by canonical name."""

    gpus: dict[str, GPU] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)
    models: dict[str, ModelEntry] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    engines: dict[str, EngineProfile] = field(default_factory=dict)
    connectors: dict[str, Connector] = field(default_factory=dict)
    networks: dict[str, NetworkLayout] = field(default_factory=dict)
    moe_kernels: dict[str, MoeKernels] = field(default_factory=dict)
    gdn_kernels: dict[str, GdnCurve] = field(default_factory=dict)
    mla_kernels: dict[str, MlaCurve] = field(default_factory=dict)
    # What a later folder (a user's --hwdb) replaces or shadows of an earlier one (the shipped data):
    # the command line prints these, since each changes answers without an error.
    notes: tuple[str, ...] = ()

    @staticmethod
    def _lookup(kind: str, table: dict, name: str):
        return find(kind, table, name, "Add your own as a file in a user hwdb folder (--hwdb DIR).")

    def gpu(self, name: str) -> GPU:
        return self._lookup("GPU", self.gpus, name)

    def link(self, name: str) -> Link:
        return self._lookup("link", self.links, name)

    def model(self, name: str) -> ModelEntry:
        p = Path(name)
        if name not in self.models and (p.is_dir() or p.suffix == ".json") and p.exists():
            return load_model_dir(p)
        try:
            return self._lookup("model", self.models, name)
        except HwdbError:
            if p.suffix == ".json" or (("/" in name or "\\" in name) and p.parent.exists()):
                load_model_dir(p)  # a path the user meant: say what is wrong with it, not "unknown model"
            raise

    def network(self, name: str) -> NetworkLayout:
        return self._lookup("network layout", self.networks, name)

    def fabric(self, name: str) -> tuple[Link, NetworkLayout | None]:
        """A KV/embedding fabric by name: a link (links/), or a node type's network layout (networks/), which
        names its link.  Returns (link, layout or None); unknown names raise HwdbError listing both kinds."""
        try:
            return self.link(name), None
        except HwdbError as exc:
            try:
                lay = find("network layout", self.networks, name, "")
            except HwdbError:
                raise HwdbError(f"{exc} Or a network layout: {', '.join(sorted(self.networks))}.") from None
            return self.links[lay.fabric], lay

    def connector(self, name: str) -> Connector:
        return self._lookup("connector", self.connectors, name)

    def engine(self, name: str) -> EngineProfile:
        return self._lookup("engine", self.engines, name)

    def find_profile(
        self, gpu: str, engine: str = "vllm", version: str | None = None, model: str | None = None
    ) -> ProfileMatch:
        """The calibration profile stored under the key (GPU, engine, engine version, model), each part
        honoured where given.

        A profile fitted on one model (``Profile.model``, a harness fit) is never used for another, and wins
        over model-independent ones (kernel fits) for its own model.  With ``version``, profiles of that version
        (:func:`version_matches`) are chosen; when there is none, the newest profile of the GPU and engine is
        the explicit fallback and ``fallback`` says so, since a kernel fit of another version is still better
        than datasheet defaults.  Among equals the newest ``created`` wins (on a tie, the one loaded first).
        """
        hits = [
            p
            for p in self.profiles.values()
            if p.gpu == gpu and p.engine == engine and (model is None or p.model in (None, model))
        ]
        if model is not None and any(p.model == model for p in hits):
            hits = [p for p in hits if p.model == model]
        if not hits:
            return ProfileMatch(None)

        def newest(ps: list[Profile]) -> Profile:
            return max(ps, key=lambda p: p.created)

        if version is None:
            return ProfileMatch(newest(hits))
        same = [p for p in hits if version_matches(p.engine_version, version)]
        if same:
            return ProfileMatch(newest(same))
        p = newest(hits)
        return ProfileMatch(
            p,
            f"no {engine} {version} profile for {gpu}: using the newest, {p.name} "
            f"(fitted under {engine} {p.engine_version})",
        )

    def moe_curve(self, gpu: str, engine: str, fmt: str, ep: int = 1) -> tuple[MoeCurve | None, str]:
        """The measured fused-MoE curve of kernel format ``fmt`` (:data:`hwdb.moe.FORMATS`) on ``gpu`` under
        ``engine`` for a layout with ``ep``-way expert parallelism, and a note of where it came from.  The
        engine's curve of the other layout class comes next, then vLLM's (the note says which); (None, "")
        when none was measured."""
        classes = ("ep_curves", "curves") if ep > 1 else ("curves", "ep_curves")
        for eng in dict.fromkeys((engine, "vllm")):
            for k in self.moe_kernels.values():
                if k.gpu != gpu or k.engine != eng:
                    continue
                for cls in classes:
                    c = getattr(k, cls).get(fmt)
                    if c is None:
                        continue
                    note = f"{k.name} {fmt} ({eng} {c.engine_version}, {'EP' if cls == 'ep_curves' else 'TP'} layouts)"
                    if cls != classes[0]:
                        note += f"; no {'EP' if ep > 1 else 'TP'}-layout curve measured"
                    return c, note if eng == engine else f"{note}; no {engine} {fmt} MoE table for {gpu}"
        return None, ""

    def gdn_curve(self, gpu: str, engine: str) -> tuple[GdnCurve | None, str]:
        """The measured Gated-DeltaNet curve of ``gpu`` under ``engine``, else vLLM's on that GPU (the note
        says so), and where it came from; (None, "") when none was measured."""
        for eng in dict.fromkeys((engine, "vllm")):
            for c in self.gdn_kernels.values():
                if c.gpu == gpu and c.engine == eng:
                    note = f"{c.name} ({eng} {c.engine_version})"
                    return c, note if eng == engine else f"{note}; no {engine} linear-attention table for {gpu}"
        return None, ""

    def mla_curve(self, gpu: str, engine: str) -> tuple[MlaCurve | None, str]:
        """The measured MLA attention curve of ``gpu`` under ``engine`` and its source, else (None, "")."""
        for c in self.mla_kernels.values():
            if c.gpu == gpu and c.engine == engine:
                return c, f"{c.name} ({engine} {c.engine_version}, {c.kernel})"
        return None, ""

    def profile_for(
        self, gpu: str, engine: str = "vllm", version: str | None = None, model: str | None = None
    ) -> Profile | None:
        """:meth:`find_profile`'s profile (None if the GPU has none for ``engine``)."""
        return self.find_profile(gpu, engine, version, model).profile


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
    mine = {_norm(n) for n in (item.name, *_aliases(item))}
    clash = next((k for k, v in table.items() if mine & {_norm(n) for n in (k, *_aliases(v))}), None)
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
