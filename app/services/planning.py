"""The planner for the app: a plan request from the current scenario, the run, its artefacts (no Streamlit).

Wraps :mod:`simulator.plan` (``PlanRequest``, ``run_plan``, ``artefacts``); see docs/planner.md.
"""

from __future__ import annotations

import io
import zipfile

from app.services.scenarios import USER_ERRORS, InputError, check_size, safe_name, sandbox, to_scenario
from simulator.inputs import decode, parse_yaml
from simulator.plan import FAMILIES, PlanError, artefacts, parse_plan_request, run_plan


def families() -> list[str]:
    """The deployment families the planner knows (colocated, pd, ...)."""
    return list(FAMILIES)


def request_from_scenario(
    d: dict,
    gpus: list[str],
    *,
    max_gpus: int = 16,
    tp: tuple[int, ...] = (1, 2, 4),
    families: tuple[str, ...] = ("colocated", "pd"),
    verify: int = 3,
    requests: int = 400,
    replications: int = 1,
    at_band_edge: bool = False,
) -> dict:
    """A plan request (as a dict) for the scenario's model, workload and SLO over the offered GPUs.

    The scenario's pool settings that the planner applies to its candidates travel with it
    (:func:`pool_constraints`, :func:`fabrics`); the layout itself (GPU, TP, PP, instances) is what the
    planner searches, over ``gpus``, ``tp`` and ``max_gpus``.  ``at_band_edge``: a candidate meets the SLO
    only at its model-error band's pessimistic edge (``constraints.slo_at_band_edge``).  Raises
    :class:`InputError` when the scenario is invalid or its pools disagree on a setting the planner keeps the
    same in every pool.
    """
    slo = dict(d.get("slo") or {})
    if not slo.get("ttft_s") and not slo.get("tpot_s"):
        raise InputError("slo: the planner needs a TTFT or TPOT target; set one in the scenario's SLO")
    scn = to_scenario(d)
    return {
        "name": f"plan-{d.get('name', 'scenario')}",
        "model": d["model"],
        "hwdb": list(d.get("hwdb", [])),
        "workload": d["workload"],
        "slo": slo,
        "gpus": [{"name": g} for g in gpus],
        "fabrics": fabrics(scn),
        "constraints": {
            "max_gpus": int(max_gpus),
            "tp": list(tp),
            "families": list(families),
            **pool_constraints(scn),
            **({"slo_at_band_edge": True} if at_band_edge else {}),
        },
        "search": {
            "verify": int(verify),
            "borderline": 1,
            "replications": int(replications),
            "requests": int(requests),
        },
    }


def _same(pools, field: str, what: str, value, fix: str):
    """The one value of ``value(pool)`` (JSON-able) over ``pools``; an InputError naming ``field`` (the
    pool key, ``what`` in words), each pool's value and ``fix`` when they differ."""
    seen = {p.name: value(p) for p in pools}
    if len({repr(v) for v in seen.values()}) > 1:
        each = ", ".join(f"{name}: {v}" for name, v in seen.items())
        raise InputError(
            f"pools[*].{field}: the pools disagree on the {what} ({each}); the planner gives every "
            f"pool of a candidate the same {what}. Fix: {fix}"
        )
    return next(iter(seen.values()))


def pool_constraints(scn) -> dict:
    """The plan request's ``constraints`` entries that carry a validated scenario's pool settings: weights
    ``dtype``, ``kv_cache_dtype`` and ``engine`` arguments (one value for every pool: the planner serves
    one checkpoint with one engine configuration), the attention data-parallel degrees ``dp`` and
    ``expert_parallel`` to try (MoE models; the planner ignores them for dense ones).

    Encoder pools are left out: the planner sizes its own, in bf16 (the vision tower), with these engine
    arguments.  PP is not carried: the planner's candidates have none (it searches TP instead).
    """
    lm = [p for p in scn.pools if p.role != "encoder"] or list(scn.pools)
    dtype = _same(
        lm,
        "dtype",
        "weights dtype",
        lambda p: p.dtype,
        "set the same weights dtype on every pool on Home, or upload a plan request YAML with "
        "constraints.dtype listing the formats to compare (e.g. [fp8, bf16]).",
    )
    kv = _same(
        lm,
        "kv_cache_dtype",
        "KV-cache dtype",
        lambda p: p.kv_cache_dtype,
        "set the same KV-cache dtype on every pool on Home, or upload a plan request YAML with "
        "constraints.kv_cache_dtype.",
    )
    engine = _same(
        lm,
        "engine",
        "engine arguments",
        lambda p: p.engine.model_dump(mode="json", exclude_defaults=True),
        "give every pool the same engine arguments on Home, or upload a plan request YAML with constraints.engine.",
    )
    # The planner's expert parallelism spans every GPU of an instance (vLLM's rule), so any ep > 1 asks for it.
    return {
        "dtype": [dtype],
        "kv_cache_dtype": kv,
        "engine": engine,
        "dp": sorted({p.dp for p in lm}),
        "expert_parallel": sorted({p.ep > 1 for p in lm}),
    }


def fabrics(scn) -> dict:
    """The plan request's ``fabrics`` from a validated scenario: the KV connector and fabric of a
    prefill/decode scenario, else the embedding transfer's of one with an encoder pool; the planner's
    defaults (nixl, each GPU's own NIC) for a colocated one.  The planner moves KV and embeddings with
    one connector over the fabrics it tries, so an E+P+D scenario whose embedding transfer names another
    connector or fabric than its KV transfer is refused (InputError)."""
    roles = {p.role for p in scn.pools}
    kv, emb = scn.kv_transfer, scn.embedding_transfer
    if (
        "prefill" in roles
        and "encoder" in roles
        and (emb.connector != kv.connector or (emb.fabric is not None and emb.fabric != kv.fabric))
    ):
        raise InputError(
            f"embedding_transfer: connector {emb.connector!r} over {emb.fabric or 'the GPU NIC'} "
            f"differs from kv_transfer's {kv.connector!r} over {kv.fabric or 'the GPU NIC'}; the "
            "planner moves KV and embeddings with one connector over one fabric. Fix: give the "
            "embedding transfer the KV transfer's connector and fabric on Home, or upload a plan "
            "request YAML with fabrics."
        )
    link = kv if "prefill" in roles else emb if "encoder" in roles else None
    return {} if link is None else {"links": [link.fabric], "connector": link.connector}


def parse_request(data: dict, origin: str = "plan request"):
    try:
        return parse_plan_request(data, origin)
    except PlanError as exc:
        raise InputError(str(exc)) from None


def parse_upload(name: str, data: bytes, folder=None) -> dict:
    """An uploaded plan YAML (size-limited, read by the reading layer), sandboxed to the upload
    ``folder`` and the shipped data like a scenario (:func:`app.services.scenarios.sandbox`), validated."""
    name = safe_name(name)
    check_size(name, data, 1 * 2**20)
    try:
        d = parse_yaml(decode(data, name, InputError, "plan request"), name, InputError)
    except InputError as exc:
        raise InputError(f"{exc}; compare with examples/plan_llama8b.yaml") from None
    d = sandbox(d, folder, name)
    parse_request(d, name)
    return d


def run(data: dict, progress=None):
    """Run the planner on a request dict in this process (one worker: the app's job is the process)."""
    req = parse_request(data)
    try:
        return run_plan(req, progress=progress, workers=1)
    except (PlanError, *USER_ERRORS) as exc:
        raise InputError(str(exc)) from None


def candidate_for_artefacts(result) -> str | None:
    """The recommended candidate, or else the closest one (None when there is none)."""
    if result.recommended:
        return result.recommended["id"]
    if result.closest is not None and len(result.closest):
        return str(result.closest.iloc[0]["id"])
    return None


def artefact_files(result, candidate_id: str | None = None) -> dict[str, str]:
    """{filename: text} (vLLM commands, Kubernetes YAML, ...) for the recommendation or ``candidate_id``."""
    try:
        if candidate_id and not (result.recommended and result.recommended["id"] == candidate_id):
            return artefacts(result, candidate_id=candidate_id)
        return artefacts(result)
    except (ValueError, KeyError) as exc:
        raise InputError(str(exc)) from None


def zip_bytes(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in sorted(files.items()):
            z.writestr(name, text)
    return buf.getvalue()
