"""The planner for the app: a plan request from the current scenario, the run, its artefacts (no Streamlit).

Wraps :mod:`simulator.plan` (``PlanRequest``, ``run_plan``, ``artefacts``); see docs/planner.md.
"""
from __future__ import annotations

import io
import zipfile


from app.services.scenarios import InputError, USER_ERRORS, check_size, safe_name, sandbox
from simulator.inputs import decode, parse_yaml
from simulator.plan import FAMILIES, PlanError, artefacts, parse_plan_request, run_plan


def families() -> list[str]:
    """The deployment families the planner knows (colocated, pd, ...)."""
    return list(FAMILIES)


def request_from_scenario(d: dict, gpus: list[str], *, max_gpus: int = 16, tp: tuple[int, ...] = (1, 2, 4),
                          families: tuple[str, ...] = ("colocated", "pd"), verify: int = 3,
                          requests: int = 400, replications: int = 1) -> dict:
    """A plan request (as a dict) for the scenario's model, workload and SLO over the offered GPUs."""
    slo = dict(d.get("slo") or {})
    if not slo.get("ttft_s") and not slo.get("tpot_s"):
        raise InputError("slo: the planner needs a TTFT or TPOT target; set one in the scenario's SLO")
    return {"name": f"plan-{d.get('name', 'scenario')}", "model": d["model"], "hwdb": list(d.get("hwdb", [])),
            "workload": d["workload"], "slo": slo, "gpus": [{"name": g} for g in gpus],
            "constraints": {"max_gpus": int(max_gpus), "tp": list(tp), "families": list(families)},
            "search": {"verify": int(verify), "borderline": 1, "replications": int(replications),
                       "requests": int(requests)}}


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
