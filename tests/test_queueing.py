"""The engine reduced to a single server agrees with queueing theory.

With one instance and ``max_num_seqs=1`` the instance serves one request at a
time, FCFS, and starts the next one as soon as the previous ends; under
Poisson arrivals it is an M/G/1 queue.  A request's service time is its
prefill step plus one decode step per further token, computed here from the
step model independently of the engine, so the service distribution is known
exactly and the Pollaczek-Khinchine mean wait
``Wq = lambda E[S^2] / (2 (1 - rho))`` can be checked.  With fixed lengths it
is M/D/1; with geometric output lengths (service ~ exponential) it is close
to M/M/1.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from simulator.resolved import resolve
from simulator.run import simulate
from tests.conftest import pool, scenario

PROMPT = 64
REPS = 6
N = 5000


def _single_server(rate: float, output_length: dict, n: int = N):
    return scenario(
        pools=pool(engine={"max_num_seqs": 1, "max_num_batched_tokens": 8192, "max_model_len": 4096}),
        workload={
            "arrival": {"kind": "poisson", "rate": rate},
            "input_length": {"kind": "fixed", "value": PROMPT},
            "output_length": output_length,
            "num_requests": n,
        },
    )


def _service_time(step, out_tokens: int) -> float:
    """Prefill of PROMPT tokens alone, then out_tokens-1 decode steps at growing context."""
    t = step.step_time(PROMPT, 1, PROMPT * (PROMPT + 1) / 2, 0.0, 0.0, 1, 0)
    for i in range(1, out_tokens):
        t += step.step_time(1, 1, 0.0, float(PROMPT + i), 0.0, 1, 0)
    return t


def _replicated_waits(scn):
    waits, sojourns, services = [], [], []
    for r in range(REPS):
        res = simulate(scn, replication=r)
        df = res.requests
        assert (df["outcome"] == "completed").all()
        waits.append(df["queue_s"].mean())
        # The engine's front end (a constant delay before the engine sees a request) is outside the queue.
        in_engine = df["e2e_s"] - df["frontend_s"]
        sojourns.append(in_engine.mean())
        services.append((in_engine - df["queue_s"]).to_numpy())
    return np.array(waits), np.array(sojourns), services


def _ci(x: np.ndarray, level: float = 0.99) -> tuple[float, float]:
    half = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return x.mean() - half, x.mean() + half


def test_md1_mean_wait_matches_theory():
    out = 8
    probe = _single_server(1.0, {"kind": "fixed", "value": out})
    step = resolve(probe).pools[0].step
    s = _service_time(step, out)
    rate = 0.6 / s
    waits, sojourns, services = _replicated_waits(_single_server(rate, {"kind": "fixed", "value": out}))
    # The engine's service times are exactly the stated deterministic service.
    assert np.allclose(np.concatenate(services), s, rtol=1e-9)
    rho = rate * s
    wq = rho * s / (2 * (1 - rho))
    lo, hi = _ci(waits)
    print(
        f"\nM/D/1 rho={rho:.2f}: Wq theory {wq * 1e3:.3f} ms, simulated {waits.mean() * 1e3:.3f} ms, "
        f"99% CI [{lo * 1e3:.3f}, {hi * 1e3:.3f}] ms over {REPS} x {N} requests"
    )
    assert lo <= wq <= hi, (lo, wq, hi)
    lo, hi = _ci(sojourns)
    assert lo <= wq + s <= hi


def test_mg1_pollaczek_khinchine_uniform_outputs():
    low, high = 1, 24
    probe = _single_server(1.0, {"kind": "uniform", "low": low, "high": high})
    step = resolve(probe).pools[0].step
    svc = np.array([_service_time(step, k) for k in range(low, high + 1)])
    es, es2 = svc.mean(), (svc**2).mean()
    rate = 0.7 / es
    waits, _, _ = _replicated_waits(_single_server(rate, {"kind": "uniform", "low": low, "high": high}))
    wq = rate * es2 / (2 * (1 - rate * es))
    lo, hi = _ci(waits)
    print(
        f"\nM/G/1 rho={rate * es:.2f}: P-K Wq {wq * 1e3:.3f} ms, simulated {waits.mean() * 1e3:.3f} ms, "
        f"99% CI [{lo * 1e3:.3f}, {hi * 1e3:.3f}] ms"
    )
    assert lo <= wq <= hi, (lo, wq, hi)


def test_near_mm1_geometric_outputs():
    """Geometric token counts make service nearly exponential: Wq ~ rho/(mu - lambda)."""
    rng = np.random.default_rng(123)
    values = tuple(int(v) for v in rng.geometric(1 / 20, size=4000))
    dist = {"kind": "empirical", "values": values}
    probe = _single_server(1.0, dist)
    step = resolve(probe).pools[0].step
    per = {k: _service_time(step, k) for k in set(values)}
    svc = np.array([per[v] for v in values])
    es = svc.mean()
    rate = 0.5 / es
    waits, _, _ = _replicated_waits(_single_server(rate, dist))
    rho = rate * es
    mm1 = rho * es / (1 - rho)
    pk = rate * (svc**2).mean() / (2 * (1 - rho))
    lo, hi = _ci(waits)
    print(
        f"\nnear-M/M/1 rho={rho:.2f}: M/M/1 Wq {mm1 * 1e3:.3f} ms, P-K Wq {pk * 1e3:.3f} ms, simulated "
        f"{waits.mean() * 1e3:.3f} ms, 99% CI [{lo * 1e3:.3f}, {hi * 1e3:.3f}] ms"
    )
    assert lo <= pk <= hi
    # Discrete geometric service is slightly less variable than exponential (E[S^2] ~ (2 - 1/m) m^2 d^2).
    assert abs(pk - mm1) / mm1 < 0.08
    assert lo <= mm1 * 1.08 and hi >= mm1 * 0.92


@pytest.mark.parametrize("instances,rate", [(1, 4.0), (3, 30.0)])
def test_littles_law(instances, rate):
    """Time-average number in system equals throughput x mean sojourn (system starts and ends empty)."""
    scn = scenario(
        pools=pool(instances=instances, engine={"max_num_seqs": 16}),
        workload={
            "arrival": {"kind": "gamma", "rate": rate, "cv": 2.0},
            "input_length": {"kind": "uniform", "low": 16, "high": 2048},
            "output_length": {"kind": "uniform", "low": 1, "high": 200},
            "num_requests": 1500,
        },
    )
    df = simulate(scn).requests
    a, f = df["arrival_s"].to_numpy(), df["finish_s"].to_numpy()
    times = np.concatenate([a, f])
    delta = np.concatenate([np.ones_like(a), -np.ones_like(f)])
    order = np.lexsort((delta, times))  # departures before arrivals at equal times
    t, d = times[order], delta[order]
    in_system = np.cumsum(d)
    assert in_system.min() >= 0 and in_system[-1] == 0
    span = t[-1] - t[0]
    area = float(np.sum(in_system[:-1] * np.diff(t)))
    L = area / span
    lam = len(df) / span
    W = float((f - a).mean())
    assert L == pytest.approx(lam * W, rel=1e-9)
