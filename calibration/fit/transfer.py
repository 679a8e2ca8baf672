"""KV-transfer setup latency and bandwidth from a PD bundle (``calibration/pd/run.py``) -> connector override.

The router records per request (``records/*.jsonl``, ``pd`` field) the prefill and decode legs;
the decode instance reports its own TTFT (``pd.decode_metrics.time_to_first_token_ms``), which for
a KV consumer is: schedule + load the prompt's KV through the connector + one decode step.  With
``bytes`` = KV bytes that move (tokens moved x KV bytes per token of the model config) the fit is

    decode-side wait  =  setup_s  +  bytes / bandwidth_Bps            (least squares, 1-sigma from
                                                                       the covariance; points beyond
                                                                       3.5 robust sigmas dropped)

``setup_s`` therefore also holds the decode instance's one step and scheduling (not separable in
these records); ``bandwidth_Bps`` is unresolved when the slope is not positive at 2 sigma (tiny
models move ~1 MB: microseconds at GB/s, below the noise) - then the bundle's directly measured
file write+read bandwidth (``manifest.file_bandwidth``) is reported for ``kv_transfer.bandwidth_Bps``.
The router-side decode leg (decode_first_byte_s - decode_sent_s, incl. HTTP) is fitted too, for reference.

Connector tokens moved: ExampleConnector (shared storage) moves only whole blocks of the prompt,
``floor((L-1)/B)*B`` tokens; other connectors move the prompt's ``L`` tokens.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
from pathlib import Path

import yaml

import hwdb
from hwdb.hf_config import arch_from_config

_WHOLE_BLOCKS = ("exampleconnector", "sharedstorageconnector")


class TransferFitError(ValueError):
    pass


def linfit(x: list[float], y: list[float]) -> dict:
    """Least squares y = a + b x with 1-sigma of a and b (residual variance estimated)."""
    n = len(x)
    if n < 3:
        raise TransferFitError(f"{n} usable points: need at least 3")
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    if sxx <= 0:
        raise TransferFitError("all requests move the same number of bytes: the slope is not identifiable")
    b = sum((u - mx) * (v - my) for u, v in zip(x, y, strict=True)) / sxx  # x, y: one point each
    a = my - b * mx
    res = [v - a - b * u for u, v in zip(x, y, strict=True)]
    s2 = sum(r * r for r in res) / (n - 2)
    return {
        "a": a,
        "b": b,
        "sa": math.sqrt(s2 * (1 / n + mx * mx / sxx)),
        "sb": math.sqrt(s2 / sxx),
        "s": math.sqrt(s2),
        "n": n,
        "res": res,
    }


def robust_linfit(x: list[float], y: list[float], k: float = 3.5) -> tuple[dict, int]:
    """:func:`linfit` after dropping points whose residual is beyond ``k`` robust sigmas (MAD)."""
    keep = list(range(len(x)))
    for _ in range(5):
        f = linfit([x[i] for i in keep], [y[i] for i in keep])
        full = [y[i] - f["a"] - f["b"] * x[i] for i in range(len(x))]
        med = sorted(abs(full[i]) for i in keep)[len(keep) // 2]
        sig = 1.4826 * med or f["s"] or 1e-12
        new = [i for i in range(len(x)) if abs(full[i]) <= k * sig]
        if new == keep or len(new) < 3:
            break
        keep = new
    return linfit([x[i] for i in keep], [y[i] for i in keep]), len(x) - len(keep)


def kv_bytes_per_token(cfg: dict, dtype_bytes: float = 2.0) -> float:
    return arch_from_config(cfg, "model").kv_elems_per_token * dtype_bytes


def transfer_rows(bundle: str | Path, kv_bytes_tok: float | None = None) -> tuple[dict, list[dict]]:
    """(manifest, rows): one row per successful request: tokens and bytes moved, decode-side waits (s)."""
    bundle = Path(bundle)
    mf = json.loads((bundle / "manifest.json").read_text())
    if kv_bytes_tok is None:
        cfg = (mf.get("model") or {}).get("config")
        if cfg is None:
            cmd = (mf.get("commands") or {}).get("decode") or []
            root = next((c for c in cmd if Path(c, "config.json").is_file()), None)
            if root is None:
                raise TransferFitError("no model config in the manifest or the decode command: pass kv_bytes_tok")
            cfg = json.loads(Path(root, "config.json").read_text())
        kv_bytes_tok = kv_bytes_per_token(cfg)
    conn = str(mf.get("connector") or "").lower()
    block = int(mf.get("block_size") or 0)
    rows = []
    for f in sorted((bundle / "records").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            pd = r.get("pd") or {}
            if r.get("kind") != "request" or not r.get("ok") or not pd:
                continue
            L = int(pd.get("prompt_tokens") or r.get("prompt_tokens") or 0)
            tokens = max(0, (L - 1) // block * block) if conn in _WHOLE_BLOCKS and block else L
            srv = (pd.get("decode_metrics") or {}).get("time_to_first_token_ms")
            leg = (
                pd["decode_first_byte_s"] - pd["decode_sent_s"]
                if pd.get("decode_first_byte_s") is not None and pd.get("decode_sent_s") is not None
                else None
            )
            rows.append(
                {
                    "id": r.get("id"),
                    "prompt_tokens": L,
                    "tokens": tokens,
                    "bytes": tokens * kv_bytes_tok,
                    "decode_ttft_s": None if srv is None else srv / 1e3,
                    "decode_leg_s": leg,
                }
            )
    if not rows:
        raise TransferFitError(f"{bundle}: no successful PD request records")
    return dict(mf, kv_bytes_per_token=kv_bytes_tok), rows


def _summary(f: dict, dropped: int) -> dict:
    pos = f["b"] > 2 * f["sb"]
    return {
        "setup_s": f["a"],
        "setup_sigma_s": f["sa"],
        "s_per_byte": f["b"],
        "s_per_byte_sigma": f["sb"],
        "bandwidth_Bps": 1 / f["b"] if pos else None,
        "bandwidth_sigma_Bps": f["sb"] / f["b"] ** 2 if pos else None,
        "resolved": pos,
        "residual_s": f["s"],
        "points": f["n"],
        "dropped": dropped,
    }


def fit_transfer(bundle: str | Path, kv_bytes_tok: float | None = None) -> dict:
    mf, rows = transfer_rows(bundle, kv_bytes_tok)
    out = {
        "bundle": str(Path(bundle).resolve()),
        "connector": mf.get("connector"),
        "kv_bytes_per_token": mf["kv_bytes_per_token"],
        "requests": len(rows),
        "file_bandwidth": mf.get("file_bandwidth"),
    }
    for key in ("decode_ttft_s", "decode_leg_s"):
        pts = [(r["bytes"], r[key]) for r in rows if r[key] is not None]
        if len(pts) >= 3:
            try:
                f, dropped = robust_linfit([p[0] for p in pts], [p[1] for p in pts])
                out[key] = _summary(f, dropped)
            except TransferFitError as exc:
                out[key] = {"error": str(exc)}
    if "decode_ttft_s" not in out and "decode_leg_s" not in out:
        raise TransferFitError("the records hold no decode-side timing (decode_metrics TTFT or router legs)")
    return out


def connector_doc(fit: dict, user_dirs=()) -> dict:
    """A connector YAML (hwdb ``connectors/``) overriding the shipped one with the measured figures."""
    base = hwdb.load(user_dirs).connector(fit["connector"] or "example")
    ttft = fit.get("decode_ttft_s") or {}
    main = ttft if "setup_s" in ttft else fit["decode_leg_s"]
    which = "decode instance TTFT (server-side)" if main is ttft else "router decode leg (incl. HTTP)"
    today = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")
    prov = f"{fit['bundle']} ({fit['requests']} requests; fitted {today} by calibration.fit.transfer)"
    fb = fit.get("file_bandwidth") or {}
    if main["resolved"]:
        bw = main["bandwidth_Bps"]
        bws = f"fitted slope: {main['bandwidth_Bps']:.3g} +- {main['bandwidth_sigma_Bps']:.2g} B/s"
    else:
        bw = fb.get("write_read_Bps")
        bws = (
            f"slope not resolved ({main['s_per_byte']:.3g} +- {main['s_per_byte_sigma']:.2g} s/B): the bytes "
            f"moved are too few for the timing noise; use the bundle's measured file write+read bandwidth "
            f"{bw:.3g} B/s"
            if bw
            else "slope not resolved and no file bandwidth in the bundle"
        )
    doc = json.loads(base.model_dump_json(exclude_none=True))
    doc["setup_s"] = {
        "value": round(max(0.0, main["setup_s"]), 6),
        "empirical": True,
        "source": f"least squares of the {which} on KV bytes moved: intercept "
        f"{main['setup_s'] * 1e3:.2f} +- {main['setup_sigma_s'] * 1e3:.2f} ms (1 sigma; "
        f"includes the decode's scheduling and one decode step; {main['dropped']} outlier(s) "
        f"dropped, residual {main['residual_s'] * 1e3:.2f} ms); {prov}",
    }
    doc["efficiency"] = {
        "value": 1.0,
        "empirical": True,
        "source": f"relative to the path bandwidth set in kv_transfer.bandwidth_Bps = {bw:.4g} B/s ({bws})"
        if bw
        else bws,
    }
    doc["notes"] = (
        (doc.get("notes") or "") + f" | Measured override: kv_transfer.bandwidth_Bps "
        f"{format(bw, '.4g') if bw else 'unknown'}; KV bytes/token {fit['kv_bytes_per_token']:.0f}; "
        f"fits: {json.dumps({k: fit[k] for k in ('decode_ttft_s', 'decode_leg_s') if k in fit})}"
    ).strip()
    return doc


def write_connector(doc: dict, hwdb_dir: str | Path) -> Path:
    folder = Path(hwdb_dir) / "connectors"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{doc['name']}.yaml"
    path.write_text(
        "# KV-transfer figures fitted by calibration.fit.transfer (provenance in the sources).\n"
        + yaml.safe_dump(doc, sort_keys=False, width=120)
    )
    hwdb.load([hwdb_dir]).connector(doc["name"])  # validate
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle")
    p.add_argument("--out", required=True, help="hwdb folder (the file goes to OUT/connectors/)")
    a = p.parse_args(argv)
    fit = fit_transfer(a.bundle)
    for k in ("decode_ttft_s", "decode_leg_s"):
        print(k, json.dumps(fit.get(k)))
    print(write_connector(connector_doc(fit), a.out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
