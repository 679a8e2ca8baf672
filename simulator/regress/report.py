"""Reports of a comparison: JUnit XML for CI systems and a Markdown summary.

JUnit: one ``<testcase>`` per (entry, figure), ``classname`` = suite.entry,
``name`` = the figure; a moved or new figure carries a ``<failure>`` whose
message states old, new, change and tolerance; a removed one is ``<skipped>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from simulator.regress.compare import Row


def fmt(x: float | str | None) -> str:
    """A figure value for people: 4 significant figures, '-' when absent, labels as they are."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:.4g}" if abs(x) < 1e6 else f"{x:,.0f}"


def fmt_change(r: Row) -> str:
    if r.change is None:
        return "changed" if isinstance(r.new, str) and r.old != r.new and r.old is not None else "-"
    rel = "" if r.rel_change is None else f" ({r.rel_change:+.1%})"
    return f"{r.change:+.4g}{rel}"


def explain(r: Row, old_label: str = "baseline") -> str:
    """One sentence on a row: ``ttft_p99_s moved: 0.31 -> 0.42 s (+0.11 (+35.5%)), tolerance ±5%``."""
    unit = "" if r.unit == "label" else f" {r.unit}"
    if r.status == "new":
        return f"{r.figure} is not in the {old_label}: {fmt(r.new)}{unit}; record it with --update"
    if r.status == "removed":
        return f"{r.figure} is in the {old_label} ({fmt(r.old)}{unit}) but no longer watched"
    s = f"{r.figure} {r.status}: {fmt(r.old)} -> {fmt(r.new)}{unit} ({fmt_change(r)}), tolerance {r.tolerance}"
    return s + ("; the entry's definition changed since the baseline" if r.redefined else "")


def junit_xml(rows: list[Row], suite: str, elapsed_s: float = 0.0, old_label: str = "baseline") -> ET.ElementTree:
    root = ET.Element("testsuites", name=f"epdsim regress {suite}")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(rows)),
        failures=str(sum(r.failed for r in rows)),
        errors="0",
        skipped=str(sum(r.status == "removed" for r in rows)),
        time=f"{elapsed_s:.3f}",
    )
    for r in rows:
        tc = ET.SubElement(ts, "testcase", classname=f"{suite}.{r.entry}", name=r.figure, time="0")
        if r.failed:
            f = ET.SubElement(tc, "failure", message=explain(r, old_label), type=f"figure-{r.status}")
            f.text = (
                f"entry {r.entry}, figure {r.figure} [{r.unit}]\n{old_label}: {fmt(r.old)}\nnew: {fmt(r.new)}\n"
                f"change: {fmt_change(r)}\ntolerance: {r.tolerance}\n"
            )
        elif r.status == "removed":
            ET.SubElement(tc, "skipped", message=explain(r, old_label))
        else:
            ET.SubElement(tc, "system-out").text = explain(r, old_label)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(
    path: str | Path, rows: list[Row], suite: str, elapsed_s: float = 0.0, old_label: str = "baseline"
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_xml(rows, suite, elapsed_s, old_label).write(path, encoding="utf-8", xml_declaration=True)
    return path


def markdown(rows: list[Row], suite: str, old_label: str = "baseline", new_label: str = "new") -> str:
    """A summary for a pull request or CI job page: the verdict, then every figure, failures first."""
    failed = [r for r in rows if r.failed]
    held = sum(r.status == "held" for r in rows)
    verdict = (
        f"**{len(failed)} of {len(rows)} figures moved beyond tolerance or are new**"
        if failed
        else f"**all {held} figures held**"
    )
    lines = [
        f"## epdsim regress: {suite}",
        "",
        verdict + f" ({old_label} → {new_label}).",
        "",
        f"| entry | figure | {old_label} | {new_label} | change | tolerance | status |",
        "|---|---|--:|--:|--:|---|---|",
    ]
    order = {"moved": 0, "new": 1, "removed": 2, "held": 3}
    for r in sorted(rows, key=lambda r: order[r.status]):
        status = {"moved": "❌ moved", "new": "❌ new", "removed": "removed", "held": "✅ held"}[r.status]
        if r.redefined:
            status += " (entry redefined)"
        lines.append(
            f"| {r.entry} | {r.figure} [{r.unit}] | {fmt(r.old)} | {fmt(r.new)} | {fmt_change(r)} "
            f"| {r.tolerance} | {status} |"
        )
    return "\n".join(lines) + "\n"
