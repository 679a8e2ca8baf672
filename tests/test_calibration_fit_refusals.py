"""Bundles that ``calibrate fit`` and ``calibrate validate`` refuse, each with one clear paragraph and
exit code 2: no profile to validate, a missing manifest, manifests that contradict their records.
The synthetic bundle is tests/test_calibration_fit.py's (made by the simulator with a known profile)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calibration import cli
from calibration.fit.inputs import FitInputError, open_bundle
from tests.test_calibration_fit import db_fixture, synthetic_fixture, tiny_fixture  # noqa: F401 - pytest fixtures, used by name


def test_validate_without_a_profile_is_refused(synthetic, tmp_path, capsys):
    (tmp_path / "empty" / "profiles").mkdir(parents=True)
    rc = cli.main(["validate", str(synthetic), "--profile", str(tmp_path / "empty")])
    err = capsys.readouterr().err
    assert rc == 2 and "holds no calibration profile" in err and "calibrate fit" in err


# ============================================================================ refusing bad bundles
def _err(argv, capsys) -> tuple[int, str]:
    rc = cli.main(argv)
    return rc, " ".join(capsys.readouterr().err.split())


def test_missing_manifest_is_refused(tmp_path, capsys):
    (tmp_path / "b" / "records").mkdir(parents=True)
    rc, err = _err(["fit", str(tmp_path / "b")], capsys)
    assert rc == 2
    assert f"{tmp_path / 'b'}" in err and "manifest.json is missing" in err and "calibrate run --out" in err
    rc, err = _err(["fit", str(tmp_path / "nothing")], capsys)
    assert rc == 2 and "not a directory" in err
    with pytest.raises(FitInputError, match="manifest.json is missing"):
        open_bundle(tmp_path / "b")


def _copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_manifest(b: Path, fn) -> None:
    m = json.loads((b / "manifest.json").read_text())
    fn(m)
    (b / "manifest.json").write_text(json.dumps(m))


def test_inconsistent_manifests_are_refused(synthetic, tmp_path, capsys):
    # not JSON
    b = _copy_bundle(synthetic, tmp_path / "a")
    (b / "manifest.json").write_text("{oops")
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "not valid JSON" in err and str(b / "manifest.json") in err
    # the plan says one prompt length, the records another
    b = _copy_bundle(synthetic, tmp_path / "b")
    _edit_manifest(b, lambda m: m["plan"][0]["requests"][0].__setitem__(1, 17))
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "has 16 prompt tokens but" in err and "plans 17" in err and "prefill.jsonl" in err
    # records of a request the plan does not have
    b = _copy_bundle(synthetic, tmp_path / "c")
    _edit_manifest(b, lambda m: m["plan"][1]["requests"].pop())
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "is not in the plan" in err
    # two launches with different engine arguments
    b = _copy_bundle(synthetic, tmp_path / "d")

    def two_launches(m):
        def ev(a):
            return {"startup": {"events": [{"phase": "engine_args", "text": a}]}}

        m["launches"] = [ev("{'max_num_seqs': 64}"), ev("{'max_num_seqs': 32}")]

    _edit_manifest(b, two_launches)
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "max_num_seqs=64" in err and "max_num_seqs=32" in err
    # block size of the arguments and of /metrics disagree
    b = _copy_bundle(synthetic, tmp_path / "e")
    _edit_manifest(b, lambda m: m["engine"].__setitem__("args_logged", "{'block_size': 16}"))
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "block_size=16" in err and "cache_config says 128" in err
    # no model config and no readable folder
    b = _copy_bundle(synthetic, tmp_path / "f")
    _edit_manifest(b, lambda m: m["model"].pop("config"))
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "--model" in err
    # a GPU server that does not say which GPU
    b = _copy_bundle(synthetic, tmp_path / "g")
    _edit_manifest(b, lambda m: (m["versions"].pop("server_python"), m["hardware"].__setitem__("server", "8x H100")))
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "--gpu NAME" in err
    # nothing to fit: no decode sweep
    b = _copy_bundle(synthetic, tmp_path / "h")
    for f in (b / "records").glob("decode_c*.jsonl"):
        f.unlink()
    rc, err = _err(["fit", str(b)], capsys)
    assert rc == 2 and "no completed decode sweep" in err
    # every message is one paragraph
    assert "\n" not in err.strip()
