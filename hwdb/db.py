"""The hardware database: GPUs, links, models, calibration profiles, engines, connectors, network layouts and
measured kernel curves by canonical name, and the lookups on them.

:class:`HardwareDB` finds an entry by name or alias (:func:`find`: case and '-' vs '_' ignored); a model is
also found by the path of its folder or ``config.json`` (:func:`load_model_dir`).  Unknown names are a
:class:`HwdbError` listing the known ones.  The database is read from its folders by
:func:`hwdb.loader.load`, which says how they merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hwdb.engine_schema import EngineProfile
from hwdb.files import HwdbError, parse_file
from hwdb.gdn import GdnCurve
from hwdb.hf_config import ConfigError, arch_from_config
from hwdb.mla import MlaCurve
from hwdb.models import ModelArch
from hwdb.moe import BACKEND_SEP, MoeCurve, MoeKernels
from hwdb.profiles import Profile, ProfileMatch, version_matches
from hwdb.schema import GPU, Connector, Link, ModelSidecar, NetworkLayout
from simulator.inputs import read_json

DATA_DIR = Path(__file__).parent / "data"


def name_key(name: str) -> str:
    """The form in which names and aliases are compared: case and '-' vs '_' ignored."""
    return name.lower().replace("-", "_")


def find(kind: str, table: dict, name: str, fix: str):
    """The entry of ``table`` called ``name``: exact key first, then any key or alias equal up to case
    and '-' vs '_'.  Unknown names raise HwdbError listing the known ones and ``fix``."""
    if name in table:
        return table[name]
    low = name_key(name)
    for key, item in table.items():
        aliases = getattr(item, "aliases", None)
        if aliases is None and hasattr(item, "sidecar"):
            aliases = item.sidecar.aliases
        if any(name_key(n) == low for n in (key, *(aliases or ()))):
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

    def moe_curve(
        self, gpu: str, engine: str, fmt: str, ep: int = 1, backend: str | None = None
    ) -> tuple[MoeCurve | None, str]:
        """The measured fused-MoE curve of kernel format ``fmt`` (:data:`hwdb.moe.FORMATS`) on ``gpu`` under
        ``engine`` for a layout with ``ep``-way expert parallelism, and a note of where it came from.  The
        engine's curve of the other layout class comes next, then vLLM's (the note says which); (None, "")
        when none was measured.  ``backend``: a kernel the engine was told to run instead of its default
        (``fmt@backend`` curves, :data:`hwdb.moe.BACKEND_SEP`); where none was measured, the default's curve
        with a note saying so."""
        if backend:
            curve, note = self.moe_curve(gpu, engine, f"{fmt}{BACKEND_SEP}{backend}", ep)
            if curve is not None:
                return curve, note
            curve, note = self.moe_curve(gpu, engine, fmt, ep)
            return (
                curve,
                f"{note}; no {backend} curve of {fmt} measured on {gpu}: the default kernel's" if note else note,
            )
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
