"""Issue 18 item 9: the Calibration page works without a server path (a sample bundle ships; bundles
upload as a zip) and a fitted profile can be downloaded, or saved and simulated on the Home page."""

from __future__ import annotations

import io
import stat
import zipfile

import pytest
import yaml
from streamlit.testing.v1 import AppTest

import hwdb
from app.services import bundles, calibration, scenarios
from tests.conftest import REPO
from tests.synthetic_bundle import CPU_TRUTH


@pytest.fixture(autouse=True)
def user_hwdb(tmp_path, monkeypatch):
    monkeypatch.setenv("EPDSIM_HWDB", str(tmp_path / "user-hwdb"))
    monkeypatch.delenv(calibration.BUNDLE_ROOTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # the sample is readable wherever the app was started


def _page() -> AppTest:
    return AppTest.from_file(str(REPO / "app" / "pages" / "4_Calibration.py"), default_timeout=240)


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _zip(entries: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return buf.getvalue()


def _sample_zip(top: str = "mybundle/") -> bytes:
    return _zip(
        {
            top + str(p.relative_to(calibration.SAMPLE_BUNDLE)): p.read_bytes()
            for p in sorted(calibration.SAMPLE_BUNDLE.rglob("*"))
            if p.is_file()
        }
    )


def test_the_sample_bundle_fits_its_known_profile_and_is_used_on_home(tmp_path):
    at = AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=240).run()  # the app's entry point
    at.switch_page("pages/4_Calibration.py").run()
    _ok(at)
    assert at.radio(key="bundle-source").value == "sample"  # works without typing a server path
    assert {m.label: m.value for m in at.metric}["model"] == "tiny-llama"
    at.button(key="fit").click().run()
    _ok(at)
    params = at.dataframe[1].value.set_index("parameter")
    assert params.loc["step_overhead_s", "value"] == pytest.approx(CPU_TRUTH["step_overhead_s"], rel=0.15)
    assert at.success and "checks within 25%" in at.success[0].value
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Download fitted profile (zip)" in labels and "Download validation report (HTML)" in labels
    at.button(key="use-profile").click().run()
    _ok(at)
    udir = tmp_path / "user-hwdb"
    assert (udir / "profiles" / "CPU-host_vllm-0.32.0_tiny-llama.yaml").is_file()
    assert (udir / "models" / "tiny-llama" / "config.json").is_file()
    # The page switched to Home with a scenario on the fitted profile: it simulates there.
    assert at.session_state["scenario"]["model"] == "tiny-llama"
    assert at.session_state["scenario"]["pools"][0]["engine"]["engine"] == "CPU-host_vllm-0.32.0_tiny-llama"
    assert not at.error, [e.value for e in at.error]
    m = {x.label: x.value for x in at.metric}
    assert m["TTFT p50"] and m["SLO attainment"].endswith("%")


def test_a_zipped_bundle_uploads_and_reads_as_the_folder_does():
    at = _page().run()
    at.radio(key="bundle-source").set_value("upload").run()
    assert at.info and "Upload a zipped bundle" in at.info[0].value
    at.file_uploader(key="bundle-zip").set_value(("mybundle.zip", _sample_zip(), "application/zip")).run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    assert {m.label: m.value for m in at.metric}["model"] == "tiny-llama"
    assert len(at.dataframe[0].value) == 6  # prefill, 4 decode sweeps, load test


@pytest.mark.parametrize(
    "entries,links,words",
    [
        ({"../evil.txt": b"x", "b/manifest.json": b"{}"}, (), ["../evil.txt", "outside the archive"]),
        ({"/etc/cron.d/x": b"x"}, (), ["/etc/cron.d/x", "outside the archive"]),
        ({"b/manifest.json": b"{}"}, ("b/records",), ["b/records", "link"]),
        ({"b/readme.txt": b"no manifest"}, (), ["no manifest.json"]),
    ],
)
def test_hostile_or_wrong_zips_are_refused_with_the_entry_named(tmp_path, entries, links, words):
    with pytest.raises(scenarios.InputError) as err:
        bundles.extract_zip("b.zip", _zip(entries, links), tmp_path)
    for w in words:
        assert w in str(err.value)
    assert not (tmp_path.parent / "evil.txt").exists()


def test_not_a_zip_is_an_inline_error():
    at = _page().run()
    at.radio(key="bundle-source").set_value("upload").run()
    at.file_uploader(key="bundle-zip").set_value(("b.zip", b"plain text", "application/zip")).run()
    _ok(at)
    assert at.error and "not a zip archive" in at.error[0].value


def test_saving_refuses_a_name_that_would_replace_a_shipped_entry(tmp_path):
    gpu = next(iter(hwdb.load().gpus))
    files = {f"gpus/{gpu}.yaml": yaml.safe_dump({"name": gpu}).encode()}
    with pytest.raises(scenarios.InputError, match="shipped entry"):
        bundles.save_to_user_hwdb(files, tmp_path / "u")
    assert not (tmp_path / "u" / "gpus").exists()
