"""``calibrate run --pin ENGINE:FRONT`` (calibration/harness/affinity.py): the engine's processes on the
engine's CPUs, the API server and the harness on the front end's; bad CPU lists are refused by name."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

import pytest

from calibration import cli
from calibration.harness.affinity import cpu_list, descendants, parse_pin, pin_below
from tests.test_calibration_harness import fake_cmd, free_port

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to pin apart")


def test_parse_pin_reads_cpu_lists():
    assert parse_pin("0:1", available={0, 1}) == ({0}, {1})
    assert parse_pin("0-2,5:3,4", available=range(8)) == ({0, 1, 2, 5}, {3, 4})
    assert cpu_list({5, 0, 2}) == "0,2,5"


@pytest.mark.parametrize(
    "spec, words",
    [
        ("0", "give ENGINE:FRONT CPU lists"),
        ("0:", "give ENGINE:FRONT CPU lists"),
        ("a:1", "the engine CPUs 'a' are not a CPU list"),
        ("3-1:0", "'3-1' of the engine CPUs is not a CPU range"),
        ("0,1:1", "CPU 1 is on both sides"),
        ("0:9", "CPU 9 is not available to this process (it may use 0,1)"),
        ("0-99999999999:1", "CPU 99999999999 of the engine CPUs is beyond any CPU id"),
        ("0:1,\xff", "the front CPUs '1,\xff' are not a CPU list"),
    ],
)
def test_parse_pin_refuses_bad_lists_by_name(spec, words):
    with pytest.raises(ValueError) as err:
        parse_pin(spec, available={0, 1})
    assert str(err.value).startswith(f"--pin {spec}") or str(err.value).startswith(f"--pin {spec!r}")
    assert words in str(err.value)


@two_cpus
def test_pin_below_moves_the_children_not_the_parent():
    """A shell (the API server's stand-in) with a child: the child's threads move to the engine CPU,
    the shell keeps its CPUs, and a second call moves nothing (already there)."""
    sh = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        for _ in range(100):  # until the shell has started its child
            kids = descendants(sh.pid)
            if kids:
                break
            time.sleep(0.02)
        assert kids, "the shell started no child"
        moved = pin_below(sh.pid, {CPUS[0]})
        assert moved and all(os.sched_getaffinity(t) == {CPUS[0]} for t in moved)
        assert os.sched_getaffinity(sh.pid) == set(CPUS)
        assert pin_below(sh.pid, {CPUS[0]}) == []
    finally:
        sh.kill()
        sh.wait()


def _run(argv, capsys):
    rc = cli.main(argv)
    return rc, capsys.readouterr().err


def test_pin_with_attach_or_a_pair_is_refused(tmp_path, capsys):
    rc, err = _run(["run", "--out", str(tmp_path / "a"), "--attach", "http://127.0.0.1:9", "--pin", "0:1"], capsys)
    assert rc == 2
    assert "--pin 0:1: an attached server's processes are not this harness's to move" in " ".join(err.split())
    rc, err = _run(["run", "--pd", "--out", str(tmp_path / "b"), "--pin", "0:1"], capsys)
    assert rc == 2 and "--pin" in err and "not an option of `calibrate run --pd`" in " ".join(err.split())
    rc, err = _run(["run", "--out", str(tmp_path / "c"), "--launch", "--pin", "0:0"], capsys)
    assert rc == 2 and "CPU 0 is on both sides" in err
    assert not (tmp_path / "c").exists()  # refused before anything was launched or written


@two_cpus
def test_a_pinned_launch_records_the_layout_and_restores_the_harness(tmp_path, capsys):
    """The fake server under a shell: the harness starts it on the front CPU, moves the shell's child
    (the engine's stand-in) to the engine CPU once it serves, records that in the manifest, and runs
    on all its CPUs again afterwards."""
    port = free_port()
    serve = shlex.join(["sh", "-c", f"{shlex.join(fake_cmd(port))} & wait"])
    before = os.sched_getaffinity(0)
    rc, err = _run(
        [
            "run",
            "--out",
            str(tmp_path / "b"),
            "--serve-cmd",
            serve,
            "--url",
            f"http://127.0.0.1:{port}",
            "--ready-timeout",
            "30",
            "--phases",
            "prefill",
            "--prefill-lengths",
            "16",
            "--prefill-repeats",
            "1",
            "--pin",
            f"{CPUS[0]}:{CPUS[1]}",
        ],
        capsys,
    )
    assert rc == 0, err
    assert os.sched_getaffinity(0) == before
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    (launch,) = manifest["launches"]
    # the server's CPUs (both lists) and the host's, not the one CPU the harness ran on while pinned (a CPU
    # peak is derived from the server's)
    server = manifest["hardware"]["server"]
    assert server["cpu_affinity"] == 2 and server["cpus"] == CPUS[:2] and server["cpu_count"] == os.cpu_count()
    assert server["pinned"] == {"engine_cpus": [CPUS[0]], "front_cpus": [CPUS[1]]}
    assert launch["pin"]["engine_cpus"] == [CPUS[0]] and launch["pin"]["front_cpus"] == [CPUS[1]]
    assert launch["pin"]["threads_moved_to_engine_cpus"] >= 1
    assert launch["env"]["VLLM_CPU_OMP_THREADS_BIND"] == str(CPUS[0])
    assert "pinned: the worker and the engine core on CPU" in err
    assert cli.main(["show", str(tmp_path / "b")]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert f"pinned: engine on CPU {CPUS[0]}, front end on CPU {CPUS[1]}" in shown
    assert f"2 cores (the server's CPUs under --pin: engine {CPUS[0]}, front end {CPUS[1]}; the host has" in shown
