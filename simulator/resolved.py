"""A scenario resolved against the hardware data: what a run, a sweep or the planner simulates.

:func:`resolve` loads the scenario's hardware database and model, turns each LLM pool into a
:class:`~simulator.perf.Deployment` (:func:`simulator.scenario.deployment_for`), checks that it fits
the GPUs (its memory plan), builds its step model and, with an ``operations`` block, its start-up
times; for prefill-decode disaggregation it builds the KV transfer plan.  :func:`rng_streams` gives
every random purpose of a run its own generator, spawned from the scenario's seed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import hwdb
from simulator.ops.opsstart import StartTimes, StartupError, start_times
from simulator.pd.pd import TransferConfigError, TransferPlan, build_transfer_plan
from simulator.perf import Deployment, FitError, MemoryPlan, plan_memory
from simulator.scenario import PoolConfig, Scenario, ScenarioError, deployment_for
from simulator.step_build import build_step_model
from simulator.stepmodel import StepModel


@dataclasses.dataclass(frozen=True)
class ResolvedPool:
    """One LLM pool of a scenario resolved against the hardware data (built by :func:`resolve` only)."""

    pool: PoolConfig
    dep: Deployment
    memory: MemoryPlan
    step: StepModel
    starts: StartTimes | None = None  # start-up delays, when the scenario has an operations block

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def role(self) -> str:
        return self.pool.role


@dataclasses.dataclass(frozen=True)
class ResolvedScenario:
    """A scenario's hardware data, model, resolved LLM pools (encoder pools: simulator.epd.epd.prepare),
    the KV transfer plan of a PD scenario and the seed its random streams spawn from."""

    db: hwdb.HardwareDB
    model: hwdb.ModelEntry
    pools: tuple[ResolvedPool, ...]
    seed: int
    transfer: TransferPlan | None = None  # PD only: bytes per token and the path model

    def streams(self, replication: int = 0) -> dict[str, np.random.Generator]:
        """Fresh generators of every random purpose of replication ``replication`` (:func:`rng_streams`)."""
        return rng_streams(self.seed, replication)

    def role(self, role: str) -> ResolvedPool | None:
        """The pool of ``role`` (the first one), or None."""
        return next((r for r in self.pools if r.role == role), None)


def resolve(scn: Scenario, db: hwdb.HardwareDB | None = None) -> ResolvedScenario:
    """Load hardware data, check that every pool fits and, with operations, model its start-ups.
    ``db``: an already loaded ``hwdb.load(scn.hwdb)`` to reuse (callers that run many scenarios)."""
    try:
        db = db if db is not None else hwdb.load(scn.hwdb)
        model = db.model(scn.model)
        models = {p.name: db.model(p.model) if p.model else model for p in scn.pools}
    except hwdb.HwdbError as exc:
        raise ScenarioError(f"model/hwdb: {exc}") from None
    if scn.is_pd:
        mp, md = models[scn.pool("prefill").name], models[scn.pool("decode").name]
        if dataclasses.replace(mp.arch, name="") != dataclasses.replace(md.arch, name=""):
            raise ScenarioError(
                f"pools: the prefill pool serves {mp.name} but the decode pool serves {md.name}; "
                "KV can only move between instances of the same model: use one model for both"
            )
    out = []
    for pool in scn.pools:
        if pool.role == "encoder":  # resolved by simulator.epd.epd.prepare
            continue
        dep = deployment_for(pool, models[pool.name], db)
        try:
            mem = plan_memory(dep)
        except FitError as exc:
            raise ScenarioError(f"pools[{pool.name}]: {exc}") from None
        out.append((pool, dep, mem, build_step_model(dep)))
    starts: dict[str, StartTimes] = {}
    if scn.operations.enabled:
        try:
            starts = {pool.name: start_times(dep, scn.operations.startup, scn.hwdb) for pool, dep, _, _ in out}
        except StartupError as exc:
            raise ScenarioError(str(exc)) from None
    pools = tuple(ResolvedPool(*x, starts.get(x[0].name)) for x in out)
    transfer = None
    if scn.is_pd:
        prefill, decode = (next(r for r in pools if r.role == role) for role in ("prefill", "decode"))
        try:
            transfer = build_transfer_plan(scn.kv_transfer, db, prefill.dep, decode.dep)
        except TransferConfigError as exc:
            raise ScenarioError(str(exc)) from None
    return ResolvedScenario(db, model, pools, scn.seed, transfer)


def rng_streams(seed: int, replication: int = 0) -> dict[str, np.random.Generator]:
    """One independent generator per purpose, spawned from (seed, replication): every random draw of a
    simulation (and of the planner's workload sample) comes from one of these.

    arrivals, lengths: the workload; faults: the operations block's crashes, node failures and link
    degradations; routing: reserved (no router draws yet); images: image counts, catalogue ids and
    resolutions (the catalogue's resolutions from a child of it); clients: closed-loop send delays;
    transfer: the KV and embedding transfers' jitter.  Giving transfers their own stream keeps the
    fault draws independent of how many transfers a run makes, and the reverse.
    """
    # New purposes go last: a child's stream depends only on its index, so the others stay the same.
    purposes = ("arrivals", "lengths", "faults", "routing", "images", "clients", "transfer")
    children = np.random.SeedSequence([seed, replication]).spawn(len(purposes))
    return {p: np.random.default_rng(c) for p, c in zip(purposes, children, strict=True)}
