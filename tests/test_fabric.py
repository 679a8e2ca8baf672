"""simulator.pd.fabric: fluid max-min fair sharing of transfers over chains of links."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from hwdb.loader import load
from simulator.pd import fabric as fabric_mod
from simulator.pd.fabric import Fabric, LinkState, TransferRecord

GB = 1e9


def run_transfers(fabric, specs):
    """Start ``(start_s, path, nbytes, extra_s)`` transfers; return their records, in order."""
    env = fabric.env
    records = [None] * len(specs)
    finishes = [0] * len(specs)

    def go(env, i, start, path, nbytes, extra):
        if start > 0:
            yield env.timeout(start)
        rec = yield fabric.transfer(path, nbytes, extra)
        finishes[i] += 1
        records[i] = rec

    for i, (start, path, nbytes, extra) in enumerate(specs):
        env.process(go(env, i, start, path, nbytes, extra))
    env.run()
    assert finishes == [1] * len(specs)
    return records


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def test_lone_transfer_on_two_link_path():
    env = simpy.Environment()
    fab = Fabric(env)
    a = LinkState("pcie", 50 * GB, 2e-6)
    b = LinkState("nic", 20 * GB, 5e-6)
    (rec,) = run_transfers(fab, [(0.0, [a, b], 3 * GB, 1e-4)])
    assert isinstance(rec, TransferRecord)
    assert rec.path == ("pcie", "nic") and rec.nbytes == 3 * GB
    assert rel(rec.duration_s, 3 * GB / (20 * GB) + 7e-6 + 1e-4) < 1e-9
    assert rel(rec.active_s, 7e-6 + 1e-4) < 1e-12
    assert fab.idle and fab.bytes_sent == fab.bytes_delivered == 3 * GB
    assert rel(a.bytes_carried, 3 * GB) < 1e-12 and rel(b.bytes_carried, 3 * GB) < 1e-12
    assert rel(b.busy_s(env.now), 3 * GB / (20 * GB)) < 1e-9
    # rate series: full rate on the bottleneck, then back to 0
    assert [r for _, r in fab.rate_series()["nic"]] == [20 * GB, 0.0]
    assert [r for _, r in fab.rate_series()["pcie"]] == [20 * GB, 0.0]


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_n_identical_transfers_share_one_link(n):
    env = simpy.Environment()
    fab = Fabric(env)
    link = LinkState("l", 10 * GB, 1e-5)
    recs = run_transfers(fab, [(0.0, [link], 1 * GB, 0.0)] * n)
    for r in recs:
        assert rel(r.duration_s - 1e-5, n * 0.1) < 1e-9
        assert r.end_s == recs[0].end_s  # completed together, in one wake-up
    assert fab.rate_series()["l"] == [(1e-5, 10 * GB), (recs[0].end_s, 0.0)]


@pytest.mark.parametrize("a_bytes,b_bytes", [(4 * GB, 10 * GB), (10 * GB, 2 * GB)])
def test_staggered_start(a_bytes, b_bytes):
    cap, t1 = 2 * GB, 1.0
    env = simpy.Environment()
    fab = Fabric(env)
    link = LinkState("l", cap)
    ra, rb = run_transfers(fab, [(0.0, [link], a_bytes, 0.0), (t1, [link], b_bytes, 0.0)])
    a_left = a_bytes - cap * t1  # A alone at full rate until t1
    if a_left <= b_bytes:  # A ends first, sharing half the rate
        ta = t1 + a_left / (cap / 2)
        tb = ta + (b_bytes - a_left) / cap
    else:
        tb = t1 + b_bytes / (cap / 2)
        ta = tb + (a_left - b_bytes) / cap
    assert rel(ra.end_s, ta) < 1e-9 and rel(rb.end_s, tb) < 1e-9
    assert rel(link.bytes_carried, a_bytes + b_bytes) < 1e-12


def test_max_min_fairness_two_links():
    env = simpy.Environment()
    fab = Fabric(env)
    l1 = LinkState("l1", 10 * GB)
    l2 = LinkState("l2", 4 * GB)
    x = fab.transfer([l1], 100 * GB)
    y = fab.transfer([l1, l2], 100 * GB)
    z = fab.transfer([l2], 100 * GB)
    env.run(until=1.0)
    # l2 is the bottleneck: Y = Z = 4/2; X takes what l1 has left, 10 - 2
    assert x.rate_Bps == pytest.approx(8 * GB, rel=1e-12)
    assert y.rate_Bps == pytest.approx(2 * GB, rel=1e-12)
    assert z.rate_Bps == pytest.approx(2 * GB, rel=1e-12)
    assert l1.rate_in_use == pytest.approx(10 * GB) and l2.rate_in_use == pytest.approx(4 * GB)
    fab.sync()
    assert x.remaining_bytes == pytest.approx(92 * GB, rel=1e-12)
    assert l1.bytes_carried == pytest.approx(10 * GB, rel=1e-12)


def test_three_level_water_filling():
    env = simpy.Environment()
    fab = Fabric(env)
    a, b, c = LinkState("a", 12.0), LinkState("b", 3.0), LinkState("c", 100.0)
    f = [fab.transfer(p, 1e6) for p in ([a], [a, b], [a, c], [c], [b])]
    env.run(until=1.0)
    # b: 3/2 -> flows 2,5 at 1.5; a: (12-1.5)/2 = 5.25 for flows 1,3; c: 100 - 5.25 for flow 4
    assert [t.rate_Bps for t in f] == pytest.approx([5.25, 1.5, 5.25, 94.75, 1.5])


def test_bandwidth_factor_doubles_bandwidth_part():
    base = LinkState("l", 8 * GB, 3e-6)
    slow = LinkState("l", 8 * GB, 3e-6, bandwidth_factor=0.5)
    (r1,) = run_transfers(Fabric(simpy.Environment()), [(0.0, [base], 2 * GB, 0.0)])
    (r2,) = run_transfers(Fabric(simpy.Environment()), [(0.0, [slow], 2 * GB, 0.0)])
    assert rel(r2.duration_s - 3e-6, 2 * (r1.duration_s - 3e-6)) < 1e-9
    with pytest.raises(ValueError):
        LinkState("bad", 1.0, bandwidth_factor=0.0)


def test_degradation_mid_transfer():
    env = simpy.Environment()
    fab = Fabric(env)
    link = LinkState("l", 4 * GB)
    tr = fab.transfer([link], 8 * GB)

    def fault(env):
        yield env.timeout(1.0)
        fab.set_bandwidth_factor(link, 0.25)

    env.process(fault(env))
    env.run()
    assert rel(tr.value.end_s, 1.0 + 4 * GB / (1 * GB)) < 1e-9
    assert [r for _, r in link.rate_series] == [4 * GB, 1 * GB, 0.0]


def test_jitter_hook_adds_latency():
    env = simpy.Environment()
    fab = Fabric(env, rng=np.random.default_rng(0))
    link = LinkState("l", 1 * GB, 1e-5, jitter=lambda rng: 2e-3)
    (rec,) = run_transfers(fab, [(0.0, [link], 1 * GB, 0.0)])
    assert rel(rec.duration_s, 1.0 + 1e-5 + 2e-3) < 1e-9
    with pytest.raises(ValueError):
        Fabric(simpy.Environment()).transfer([LinkState("j", 1.0, jitter=lambda rng: 0.0)], 1.0)


def test_zero_bytes_and_empty_path_complete_after_latency():
    env = simpy.Environment()
    fab = Fabric(env)
    link = LinkState("l", 1 * GB, 5e-6)
    r0, r1 = run_transfers(fab, [(0.0, [link], 0.0, 1e-3), (0.5, [], 1e6, 0.0)])
    assert r0.end_s == pytest.approx(5e-6 + 1e-3, rel=1e-12)
    assert r1.end_s == 0.5
    assert link.rate_series == [] and fab.idle and fab.bytes_sent == fab.bytes_delivered


def test_bad_input():
    fab = Fabric(simpy.Environment())
    link = LinkState("l", 1.0)
    fab.transfer([link], 1.0)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            fab.transfer([link], bad)
    with pytest.raises(ValueError):
        fab.transfer([link, link], 1.0)
    with pytest.raises(ValueError):
        fab.transfer([LinkState("l", 2.0)], 1.0)  # a different link with a taken name
    with pytest.raises(ValueError):
        Fabric(simpy.Environment()).transfer([link], 1.0)  # link already owned
    with pytest.raises(ValueError):
        LinkState("z", 0.0)


def test_stale_wakeups_do_not_complete_early():
    # Many arrivals reschedule the wake-up; every transfer still ends at the fluid time.
    env = simpy.Environment()
    fab = Fabric(env)
    link = LinkState("l", 1.0)
    recs = run_transfers(fab, [(0.1 * i, [link], 1.0, 0.0) for i in range(10)])
    assert rel(recs[-1].end_s, 10.0) < 1e-9  # work conserving: 10 bytes at 1 B/s
    assert rel(link.busy_s(env.now), 10.0) < 1e-9


def test_from_hwdb_link():
    ib = load().link("ib-ndr")
    ls = LinkState.from_link(ib, name="nic0-egress")
    assert ls.name == "nic0-egress"
    assert ls.capacity_Bps == ib.effective_Bps and ls.latency_s == ib.latency_s.value


# ------------------------------------------------------------------ property


def check_series(fab, end_s):
    """No link above capacity; integral of the rate series equals bytes carried."""
    for name, series in fab.rate_series().items():
        ln = fab.links[name]
        times = [t for t, _ in series]
        assert times == sorted(times)
        assert all(r <= ln.available_Bps * (1 + 1e-9) for _, r in series)
        assert not series or series[-1][1] == 0.0
        area = sum(r * (t2 - t1) for (t1, r), (t2, _) in zip(series, series[1:], strict=False))
        assert area == pytest.approx(ln.bytes_carried, rel=1e-6)


flow = st.tuples(
    st.floats(0.0, 5.0),  # start time, s
    st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True),  # path over 3 links
    st.one_of(st.just(0.0), st.floats(1.0, 1e4)),  # bytes
    st.floats(0.0, 0.1),  # extra_s
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(flow, min_size=1, max_size=25),
    st.tuples(st.floats(1.0, 1e4), st.floats(1.0, 1e4), st.floats(1.0, 1e4)),
    st.tuples(*[st.floats(0.0, 1e-2)] * 3),
)
def test_property_random_flows(flows, caps, lats):
    env = simpy.Environment()
    fab = Fabric(env)
    links = [LinkState(f"l{i}", caps[i], lats[i]) for i in range(3)]
    specs = [(s, [links[i] for i in p], nb, x) for s, p, nb, x in flows]
    recs = run_transfers(fab, specs)  # asserts each finishes exactly once
    for (start, path, nb, extra), r in zip(specs, recs, strict=True):
        lone = sum(ln.latency_s for ln in path) + extra + nb / min(ln.capacity_Bps for ln in path)
        assert r.start_s == pytest.approx(start, abs=1e-12)
        assert r.duration_s >= lone * (1 - 1e-9) - 1e-12
        assert r.nbytes == nb
    assert fab.idle and fab.n_active == 0
    # summed exactly: the correctly rounded sum of the sizes, whatever the order they completed in
    assert fab.bytes_sent == float(sum(Fraction(nb) for *_, nb, _ in specs))
    assert fab.bytes_delivered == fab.bytes_sent
    for ln in links:
        expect = sum(nb for _, path, nb, _ in specs if ln in path)
        assert ln.bytes_carried == pytest.approx(expect, rel=1e-9, abs=1e-9)
        assert ln.n_active == 0
    if fab.links:
        check_series(fab, env.now)


def test_hundreds_of_flows_fast():
    env = simpy.Environment()
    fab = Fabric(env)
    rng = np.random.default_rng(1)
    nics = [LinkState(f"nic{i}", 50 * GB, 5e-6) for i in range(16)]
    specs = [
        (
            float(rng.uniform(0, 0.5)),
            [nics[rng.integers(8)], nics[8 + rng.integers(8)]],
            float(rng.uniform(1e6, 1e9)),
            0.0,
        )
        for _ in range(600)
    ]
    recs = run_transfers(fab, specs)
    assert len(recs) == 600 and fab.bytes_delivered == fab.bytes_sent
    check_series(fab, env.now)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True), min_size=1, max_size=20),
    st.tuples(*[st.floats(1.0, 1e3)] * 4),
)
def test_property_rates_are_max_min_fair(paths, caps):
    """Bottleneck characterisation: each flow crosses a saturated link where its rate is the largest."""
    env = simpy.Environment()
    fab = Fabric(env)
    links = [LinkState(f"l{i}", c) for i, c in enumerate(caps)]
    flows = [fab.transfer([links[i] for i in p], 1e12) for p in paths]
    env.run(until=1e-3)
    for ln in links:
        on = [f for f in flows if ln in f.path]
        assert sum(f.rate_Bps for f in on) <= ln.available_Bps * (1 + 1e-9)
    for f in flows:
        assert f.rate_Bps > 0
        assert any(
            sum(g.rate_Bps for g in flows if ln in g.path) >= ln.available_Bps * (1 - 1e-9)
            and all(g.rate_Bps <= f.rate_Bps * (1 + 1e-9) for g in flows if ln in g.path)
            for ln in f.path
        )


def test_late_small_transfers_terminate():
    # At large absolute times now + dt - now != dt; completion must still happen, exactly once.
    env = simpy.Environment(initial_time=1e7)
    fab = Fabric(env)
    link = LinkState("l", 1e12, 1e-6)
    recs = run_transfers(fab, [(i * 1e-9, [link], 1.0 + i, 0.0) for i in range(20)])
    assert all(r.end_s >= r.start_s for r in recs) and fab.idle
    assert link.bytes_carried == pytest.approx(sum(1.0 + i for i in range(20)), rel=1e-9)


def test_one_flow_path_gives_the_progressive_fillings_values(monkeypatch):
    """With at most one transfer active the fabric skips the heap (ONE_FLOW_PATH); records, byte counts
    and rate series are those of the progressive filling, exactly, with transfers alone and overlapping."""

    def run(fast):
        monkeypatch.setattr(fabric_mod, "ONE_FLOW_PATH", fast)
        env = simpy.Environment()
        fab = Fabric(env)
        links = [LinkState(f"l{i}", (3 + i) * GB, 1e-5 * i, bandwidth_factor=1.0 - 0.1 * (i % 3)) for i in range(5)]
        rng = np.random.default_rng(4)
        specs = [
            (
                float(rng.uniform(0, 30.0)),
                [links[j] for j in rng.choice(5, int(rng.integers(1, 4)), replace=False)],
                float(rng.uniform(1e6, 4e8)),
                float(rng.uniform(0, 1e-3)),
            )
            for _ in range(300)
        ]
        recs = run_transfers(fab, specs)
        return recs, [(ln.bytes_carried, ln.rate_series, ln.busy_s(env.now)) for ln in links], env.now

    assert run(True) == run(False)
