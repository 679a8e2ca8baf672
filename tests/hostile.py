"""Shared pieces of the hostile-input tests (tests/test_hostile_input*.py): the shipped files they
start from, writers of bad files, and the check that a command refuses input cleanly: exit code 2,
no traceback, the named words in the message, under 5 s."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import yaml

from simulator.cli import commands as cli

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "examples" / "llama8b_h100_chat.yaml").read_text())
PLAN = yaml.safe_load((REPO / "examples" / "plan_llama8b.yaml").read_text())
GPU = (REPO / "hwdb" / "data" / "gpus" / "H100-SXM-80GB.yaml").read_text()
LINK = (REPO / "hwdb" / "data" / "links" / "cloud-vpc.yaml").read_text()
LLAMA = (
    json.loads((REPO / "hwdb" / "data" / "models" / "Llama-3.1-8B" / "config.json").read_text())
    if (REPO / "hwdb" / "data" / "models" / "Llama-3.1-8B" / "config.json").exists()
    else None
)
LAUGHS = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    + "model: *i\n"
)


def scenario(**workload) -> dict:
    d = copy.deepcopy(BASE)
    d["workload"]["num_requests"] = 20
    d["workload"].update(workload)
    return d


def put(tmp: Path, name: str, content) -> Path:
    """Write ``content`` (dict/list as YAML, str as text, bytes as is) to ``tmp/name``."""
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content)
    else:
        p.write_text(yaml.safe_dump(content, sort_keys=False))
    return p


def setting(d: dict, dotted: str, value) -> dict:
    d = copy.deepcopy(d)
    node = d
    *head, last = dotted.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    node[last] = value
    return d


def run_main(argv: list[str], capsys) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out + out.err, time.monotonic() - t0


def expect_user_error(argv, words, capsys):
    rc, out, took = run_main(argv, capsys)
    assert rc == 2, f"exit {rc}:\n{out}"
    assert "Traceback" not in out, out
    for w in words:
        assert w in out, f"{w!r} not in:\n{out}"
    assert took < 5.0, f"took {took:.1f} s"
    return out


PLAIN_HEAD = "arrival_s,input_tokens,output_tokens\n"


def with_cfg(**change) -> dict:
    cfg = dict(
        LLAMA
        or {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 32,
            "intermediate_size": 14336,
            "vocab_size": 128256,
        }
    )
    for k, v in change.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg
