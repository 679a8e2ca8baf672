"""Hostile calibration bundles: `calibrate show` and `calibrate validate` on a malformed manifest or
record exit 2 with one message naming the file (and a record's line), the field, the value and the fix.

Each case starts from the sample bundle in examples/calibration_sample (what `epdsim calibrate run`
writes) and breaks one thing in it; the untouched sample must still be read, so the checks refuse
nothing the harness writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calibration.harness.bundle import Bundle, BundleError
from tests.hostile import REPO, expect_user_error, run_main

SAMPLE = REPO / "examples" / "calibration_sample"
FIX = "fix: restore the value `epdsim calibrate run` wrote"


def sample(tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    shutil.copytree(SAMPLE, b)
    return b


def edit_manifest(b: Path, change) -> Path:
    m = json.loads((b / "manifest.json").read_text())
    change(m)
    (b / "manifest.json").write_text(json.dumps(m))
    return b


def edit_record(b: Path, phase: str, line: int, change) -> Path:
    """Apply ``change`` to the record on ``line`` (1-based) of ``records/<phase>.jsonl``."""
    f = b / "records" / f"{phase}.jsonl"
    lines = f.read_text().splitlines()
    rec = json.loads(lines[line - 1])
    change(rec)
    lines[line - 1] = json.dumps(rec)
    f.write_text("\n".join(lines) + "\n")
    return b


def both(b: Path, words: list[str], capsys) -> None:
    """``calibrate show`` and ``calibrate validate`` refuse ``b`` with every one of ``words``."""
    expect_user_error(["calibrate", "show", b], words, capsys)
    expect_user_error(["calibrate", "validate", b, "--profile", REPO / "hwdb"], words, capsys)


def test_the_sample_bundle_is_read(tmp_path, capsys):
    """The checks refuse nothing the harness writes: the sample bundle shows, with every phase."""
    rc, out, _ = run_main(["calibrate", "show", sample(tmp_path), "--json"], capsys)
    assert rc == 0, out
    assert [p["phase"] for p in json.loads(out)["phases"]][:1] == ["prefill"]


# ----------------------------------------------------------------------------- the manifest


def test_ready_s_not_a_number(tmp_path, capsys):
    def change(m):
        m["launches"] = [{"index": 0, "ready_s": "soon", "startup": {"summary": {}}}]

    both(
        edit_manifest(sample(tmp_path), change),
        ["manifest.json", "launches[0].ready_s", "must be a number from 0 to 1e9 s", "(got 'soon')", FIX],
        capsys,
    )


def test_startup_figure_not_a_number(tmp_path, capsys):
    def change(m):
        m["launches"] = [{"index": 0, "ready_s": 3.0, "startup": {"summary": {"weights_load_s": "fast"}}}]

    both(
        edit_manifest(sample(tmp_path), change),
        ["manifest.json", "launches[0].startup.summary.weights_load_s", "(got 'fast')", "give seconds"],
        capsys,
    )


def test_phase_name_escaping_the_folder(tmp_path, capsys):
    def change(m):
        m["plan"][0]["name"] = "../../escape"

    both(
        edit_manifest(sample(tmp_path), change),
        ["manifest.json", "plan[0].name", "(got '../../escape')", "records/<name>.jsonl", "rename the phase"],
        capsys,
    )


def test_schema_version_as_text(tmp_path, capsys):
    def change(m):
        m["schema_version"] = "1"

    both(
        edit_manifest(sample(tmp_path), change),
        ["manifest.json", "schema_version", "(got '1')", "write 1 without quotes"],
        capsys,
    )


def test_schema_version_of_another_epdsim(tmp_path, capsys):
    def change(m):
        m["schema_version"] = 7

    both(
        edit_manifest(sample(tmp_path), change),
        ["manifest.json", "schema_version 7", "reads version 1", "measure again"],
        capsys,
    )


def test_served_name_empty(tmp_path, capsys):
    def change(m):
        m["model"]["served_name"] = " "

    both(edit_manifest(sample(tmp_path), change), ["manifest.json", "model.served_name", "(got ' ')", FIX], capsys)


def test_planned_request_with_a_negative_length(tmp_path, capsys):
    def change(m):
        m["plan"][0]["requests"][0][1] = -16

    both(
        edit_manifest(sample(tmp_path), change),
        ["manifest.json", "plan[0].requests[0][1]", "(got -16)", "whole number from 0"],
        capsys,
    )


def test_manifest_not_utf8(tmp_path, capsys):
    b = sample(tmp_path)
    (b / "manifest.json").write_bytes(b'{"schema_version": 1, "mode": "\xff\xfe"}')
    both(b, ["manifest.json", "not UTF-8", "0xff", "save it as UTF-8"], capsys)


# ----------------------------------------------------------------------------- the records


def test_request_without_ttft(tmp_path, capsys):
    b = edit_record(sample(tmp_path), "prefill", 3, lambda r: r.pop("ttft_s"))
    both(
        b, ["records/prefill.jsonl line 3", "request record", "ttft_s: required, but absent; add this key", FIX], capsys
    )


def test_request_without_token_times(tmp_path, capsys):
    b = edit_record(sample(tmp_path), "decode_c1", 2, lambda r: r.pop("token_times_s"))
    both(b, ["records/decode_c1.jsonl line 2", "token_times_s: required, but absent; add this key", FIX], capsys)


def test_negative_ttft(tmp_path, capsys):
    b = edit_record(sample(tmp_path), "prefill", 1, lambda r: r.update(ttft_s=-0.5))
    both(b, ["records/prefill.jsonl line 1", "ttft_s", "must be a number from 0 to 1e9 s", "(got -0.5)"], capsys)


def test_nan_token_time(tmp_path, capsys):
    b = edit_record(sample(tmp_path), "decode_c2", 4, lambda r: r["token_times_s"].__setitem__(1, float("nan")))
    both(b, ["records/decode_c2.jsonl line 4", "token_times_s[1]", "must be a number", "(got nan)"], capsys)


def test_token_count_as_text(tmp_path, capsys):
    b = edit_record(sample(tmp_path), "prefill", 2, lambda r: r.update(output_tokens="one"))
    both(b, ["records/prefill.jsonl line 2", "output_tokens", "whole number", "(got 'one')"], capsys)


def test_server_ttft_negative(tmp_path, capsys):
    b = edit_record(sample(tmp_path), "prefill", 1, lambda r: r["server_metrics"].update(time_to_first_token_ms=-3))
    both(b, ["records/prefill.jsonl line 1", "server_metrics.time_to_first_token_ms", "(got -3)", "ms"], capsys)


def test_record_line_not_json(tmp_path, capsys):
    b = sample(tmp_path)
    f = b / "records" / "prefill.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join([lines[0], "not json at all", *lines[1:]]) + "\n")
    both(b, ["records/prefill.jsonl line 2", "not a JSON record", "'not json at all'", "one JSON object", FIX], capsys)


def test_record_with_broken_json_inside(tmp_path, capsys):
    """A line that starts like the harness's records but is broken in its middle is no torn write."""
    b = sample(tmp_path)
    f = b / "records" / "prefill.jsonl"
    f.write_text('{"kind":"request", oops}\n' + f.read_text())
    both(b, ["records/prefill.jsonl line 1", "not a JSON record", "Expecting property name"], capsys)


def test_unknown_record_kind(tmp_path, capsys):
    b = edit_record(sample(tmp_path), "prefill", 1, lambda r: r.update(kind="guess"))
    both(b, ["records/prefill.jsonl line 1", "unknown record kind 'guess'", "phase_start", FIX], capsys)


def test_segment_as_text(tmp_path, capsys):
    b = sample(tmp_path)
    lines = (b / "records" / "decode_c1.jsonl").read_text().splitlines()
    n = next(i for i, line in enumerate(lines, 1) if json.loads(line)["kind"] == "metrics")
    edit_record(b, "decode_c1", n, lambda r: r.update(segment="first"))
    both(b, [f"records/decode_c1.jsonl line {n}", "metrics record", "segment", "(got 'first')"], capsys)


def test_validate_gives_the_bundle_fix_once(tmp_path, capsys):
    """A bad value gets its own fix only; the generic "point at a bundle" fix is for a folder that is none."""
    b = edit_record(sample(tmp_path), "prefill", 3, lambda r: r.pop("ttft_s"))
    out = expect_user_error(["calibrate", "validate", b, "--profile", REPO / "hwdb"], ["ttft_s", FIX], capsys)
    assert "Point at a directory" not in out, out
    expect_user_error(
        ["calibrate", "validate", tmp_path / "none", "--profile", REPO / "hwdb"],
        ["none", "not a directory", "Point at a directory written by `epdsim calibrate run"],
        capsys,
    )


# ----------------------------------------------------------------------------- what stays readable


def test_torn_last_line_is_skipped(tmp_path, capsys):
    """A writer killed mid-line leaves the start of a record: it is skipped, as on resume."""
    b = sample(tmp_path)
    with open(b / "records" / "prefill.jsonl", "a") as fh:
        fh.write('{"kind":"request","phase":"prefill","id":"prefill-p16-r9","ok":true,"ttft_s":0.00')
    rc, out, _ = run_main(["calibrate", "show", b], capsys)
    assert rc == 0, out


def test_failed_request_needs_no_measurements(tmp_path, capsys):
    """A failed request's record (no token came) has no figures to check."""
    b = sample(tmp_path)
    with open(b / "records" / "prefill.jsonl", "a") as fh:
        fh.write(
            json.dumps(
                {
                    "kind": "request",
                    "id": "prefill-p16-r0",
                    "ok": False,
                    "error": "timeout",
                    "t_send": float("nan"),
                    "ttft_s": None,
                    "token_times_s": [],
                    "model": "tiny-llama",
                }
            )
            + "\n"
        )
    rc, out, _ = run_main(["calibrate", "show", b], capsys)
    assert rc == 0, out


def test_kernel_bundle_records_open(tmp_path):
    """A kernel-benchmark bundle's request records hold timings of operators, not of requests."""
    b = Bundle.create(
        tmp_path / "k", {"mode": "kernels", "model": {"served_name": "m"}, "plan": [{"name": "gemm", "kind": "kernel"}]}
    )
    b.append("gemm", {"kind": "request", "id": "g1", "ok": True, "op": "gemm", "seconds": 1e-4})
    assert Bundle.open(tmp_path / "k", complete=True).requests("gemm")[0]["seconds"] == 1e-4
    b.append("gemm", {"kind": "request", "id": "g2", "ok": True, "op": "gemm", "seconds": -1})
    with pytest.raises(BundleError, match=r"gemm.jsonl line 2.*\n  seconds: must be a number"):
        Bundle.open(tmp_path / "k")
