"""`epdsim plan`: exit codes, one-paragraph errors, tables and artefact files."""

from __future__ import annotations

import yaml

from simulator.cli import main
from tests.test_plan import request


def _write(tmp_path, data, name="req.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_plan_command_prints_the_recommendation_and_writes_artefacts(tmp_path, capsys):
    data = request(
        search={
            "verify": 1,
            "borderline": 0,
            "verify_front": 0,
            "replications": 1,
            "requests": 200,
            "goodput_iterations": 1,
        }
    )
    rc = main(
        [
            "plan",
            _write(tmp_path, data),
            "--workers",
            "1",
            "--quiet",
            "--artefacts",
            str(tmp_path / "art"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "recommended:" in out and "Pareto front" in out and "families" in out
    written = {p.relative_to(tmp_path / "art").as_posix() for p in (tmp_path / "art").rglob("*") if p.is_file()}
    assert {"k8s/deployment.yaml", "router.yaml", "README.md"} <= written
    assert any(w.startswith("vllm/") for w in written) and any(w.startswith("sglang/") for w in written)
    assert {"verified.jsonl", "candidates.csv", "pareto.csv", "recommended.json"} <= {
        p.name for p in (tmp_path / "out").iterdir()
    }


def test_plan_command_user_errors_exit_2_with_one_paragraph(tmp_path, capsys):
    bad = request(constraints={"tp": [1], "max_gpus": 2, "maxgpus": 3})
    assert main(["plan", _write(tmp_path, bad)]) == 2
    err = capsys.readouterr().err
    assert "constraints.maxgpus: unknown key" in err and "Traceback" not in err
    assert main(["plan", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_plan_command_without_a_feasible_deployment_shows_the_closest_and_exits_1(tmp_path, capsys):
    data = request(
        slo={"ttft_s": 0.001, "tpot_s": 0.0005},
        search={
            "verify": 1,
            "borderline": 1,
            "verify_front": 0,
            "replications": 1,
            "requests": 200,
            "goodput_iterations": 1,
        },
    )
    assert main(["plan", _write(tmp_path, data), "--workers", "1", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "closest candidates" in out and "no candidate meets the SLO" in out
