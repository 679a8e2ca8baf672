"""Trace readers: committed excerpts, the full shared traces, and malformed files.

A reader must either return a valid :class:`Trace` (arrivals in seconds from 0,
sorted; token counts >= 1) or raise :class:`TraceError` naming the file, the
line and the column.
"""

from __future__ import annotations

import math
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.traces import (
    HASH_BLOCK_TOKENS,
    TraceError,
    TraceWarning,
    detect_format,
    read_azure_csv,
    read_mooncake_jsonl,
    read_plain,
    read_token_columns,
    read_trace,
)

FIXTURES = Path(__file__).parent / "fixtures"
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
needs_shared = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=f"shared traces not present at {SHARED_TRACES}")

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------ committed excerpts


def test_azure_conv_excerpt():
    tr = read_azure_csv(FIXTURES / "azure_conv_head.csv")
    assert len(tr) == 15
    assert tr.arrival_s.dtype == np.float64 and tr.input_tokens.dtype == np.int64
    assert tr.arrival_s[0] == 0.0
    assert tr.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    assert tr.arrival_s[-1] == pytest.approx(57.2267160 - 46.6805900, abs=1e-6)
    assert (tr.input_tokens[:3] == [374, 396, 879]).all()
    assert (tr.output_tokens[:3] == [44, 109, 55]).all()
    assert tr.hash_ids is None and tr.notes == ()


def test_azure_keeps_sub_millisecond_gaps():
    tr = read_trace(FIXTURES / "azure_code_head.csv")
    assert tr.arrival_s[-1] - tr.arrival_s[-2] == pytest.approx(25e-6, abs=1e-9)


def test_mooncake_excerpt():
    tr = read_mooncake_jsonl(FIXTURES / "mooncake_conv_head.jsonl")
    assert len(tr) == 14
    assert (tr.arrival_s == [0.0] * 10 + [3.0] * 4).all()  # timestamps are milliseconds
    assert tr.input_tokens[11] == 87169 and tr.output_tokens[4] == 3
    assert tr.hash_block_tokens == HASH_BLOCK_TOKENS == 512
    assert [len(h) for h in tr.hash_ids] == [math.ceil(n / 512) for n in tr.input_tokens]
    assert tr.hash_ids[0][:3] == (0, 1, 2)


def test_plain_jsonl_excerpt():
    tr = read_plain(FIXTURES / "sharegpt300_llama3_head.jsonl")
    assert len(tr) == 15
    assert tr.arrival_s[1] == pytest.approx(0.285059)
    assert tr.input_tokens[0] == 2358 and tr.output_tokens[0] == 531


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("azure_conv_head.csv", "azure"),
        ("mooncake_conv_head.jsonl", "mooncake"),
        ("sharegpt300_llama3_head.jsonl", "plain"),
    ],
)
def test_detect_format(name, fmt):
    assert detect_format(FIXTURES / name) == fmt
    assert len(read_trace(FIXTURES / name)) == len(read_trace(FIXTURES / name, fmt))


def test_lengths_file_is_not_a_trace_and_says_what_to_use():
    with pytest.raises(TraceError, match="pairs length distribution"):
        read_trace(FIXTURES / "sharegpt_lengths_head.csv")


def test_read_token_columns():
    cols = read_token_columns(
        FIXTURES / "sharegpt_lengths_head.csv", {"num_prefill_tokens": "input", "num_decode_tokens": "output"}
    )
    assert cols["num_prefill_tokens"][:2].tolist() == [74, 290]
    assert cols["num_decode_tokens"][:2].tolist() == [918, 905]


def test_limit_reads_first_rows():
    assert len(read_trace(FIXTURES / "azure_conv_head.csv", limit=4)) == 4
    assert len(read_trace(FIXTURES / "mooncake_conv_head.jsonl", limit=4)) == 4


def test_plain_csv_with_hash_ids(tmp_path):
    path = _write(tmp_path, "p.csv", 'arrival_s,input_tokens,output_tokens,hash_ids\n0.5,600,3,"1 2"\n1.5,100,4,[1]\n')
    tr = read_trace(path)
    assert tr.arrival_s.tolist() == [0.0, 1.0]
    assert tr.hash_ids == ((1, 2), (1,)) and tr.hash_block_tokens == 512


# ------------------------------------------------------------ adjustments


def test_zero_output_is_clamped_with_a_counted_warning(tmp_path):
    path = _write(
        tmp_path,
        "z.csv",
        AZURE_HEADER + "2023-11-16 18:00:00.0,10,0\n2023-11-16 18:00:01.0,10,5\n2023-11-16 18:00:02.0,10,0\n",
    )
    with pytest.warns(TraceWarning, match=r"2 row\(s\) have GeneratedTokens=0 \(first at line 2\)"):
        tr = read_trace(path)
    assert tr.output_tokens.tolist() == [1, 5, 1]
    assert len(tr.notes) == 1 and "z.csv" in tr.notes[0]


def test_unsorted_rows_are_sorted_stably_with_a_warning(tmp_path):
    rows = [(3.0, 30, 1), (1.0, 10, 1), (1.0, 11, 1), (2.0, 20, 1), (1.0, 12, 1)]
    text = "".join(f'{{"timestamp": {t * 1000}, "input_length": {i}, "output_length": {o}}}\n' for t, i, o in rows)
    path = _write(tmp_path, "u.jsonl", text)
    with pytest.warns(TraceWarning, match=r"2 arrival\(s\) earlier.*first at line 2"):
        tr = read_trace(path)
    assert tr.arrival_s.tolist() == [0.0, 0.0, 0.0, 1.0, 2.0]
    assert tr.input_tokens.tolist() == [10, 11, 12, 20, 30]  # ties keep file order


def test_sorted_trace_reads_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_trace(FIXTURES / "azure_conv_head.csv")


# ------------------------------------------------------------ malformed files

BAD_FILES = [
    # (file name, content, line, column or key, other text expected in the message)
    (
        "gen.csv",
        AZURE_HEADER + "2023-11-16 18:00:00.0,5,7\n2023-11-16 18:00:01.0,5,abc\n",
        2 + 1,
        "GeneratedTokens",
        "'abc'",
    ),
    ("neg.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,-5,7\n", 2, "ContextTokens", "positive"),
    ("zero_in.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,0,7\n", 2, "ContextTokens", "positive"),
    ("frac.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5,7.5\n", 2, "GeneratedTokens", "integer"),
    ("ts.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5,7\nyesterday,5,7\n", 3, "TIMESTAMP", "timestamp"),
    ("short.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5\n", 2, "GeneratedTokens", "''"),
    ("blank.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5,7\n\n\n2023-11-16 18:00:01,x,7\n", 5, "ContextTokens", "'x'"),
    ("hdr.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:00:00.0,5\n", 1, "GeneratedTokens", "header"),
    ("nohdr.csv", "2023-11-16 18:00:00.0,5,7\n", 1, "TIMESTAMP", "header"),
    (
        "json.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n',
        2,
        "",
        "not valid JSON",
    ),
    (
        "key.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n{"timestamp": 1, "input_length": 5}\n',
        3,
        "output_length",
        "missing key",
    ),
    (
        "type.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
        '{"timestamp": 1, "input_length": "many", "output_length": 1}\n',
        2,
        "input_length",
        "'many'",
    ),
    ("list.jsonl", '{"timestamp": 0, "input_length": [5], "output_length": 1}\n', 1, "input_length", "[5]"),
    (
        "hash.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": 7}\n',
        2,
        "hash_ids",
        "block ids",
    ),
    ("arr.csv", "arrival_s,input_tokens,output_tokens\n0.0,5,1\nsoon,5,1\n", 3, "arrival_s", "number"),
    ("arr.jsonl", '{"arrival_s": null, "input_tokens": 5, "output_tokens": 1}\n', 1, "arrival_s", "None"),
]


@pytest.mark.parametrize("name, text, line, column, extra", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_malformed_row_names_file_line_and_column(tmp_path, name, text, line, column, extra):
    path = _write(tmp_path, name, text)
    if name.startswith("arr"):
        fmt = "plain"
    else:
        fmt = "azure" if name.endswith(".csv") else "mooncake"
    with pytest.raises(TraceError) as info:
        read_trace(path, fmt)
    msg = str(info.value)
    assert str(path) in msg
    assert f"line {line}:" in msg
    assert column in msg and extra in msg
    assert "\n" not in msg  # one paragraph


@pytest.mark.parametrize(
    "name, text, fmt, phrase",
    [
        ("empty.csv", "", "azure", "is empty"),
        ("blank.jsonl", "\n\n", "mooncake", "is empty"),
        ("empty.csv", "", "auto", "is empty"),
        ("header.csv", AZURE_HEADER, "azure", "header but no rows"),
        ("header2.csv", AZURE_HEADER + "\n", "azure", "header but no rows"),
        ("wide.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5,7,9,9\n", "azure", "line 2: 5 fields"),
    ],
)
def test_empty_or_unreadable_files(tmp_path, name, text, fmt, phrase):
    path = _write(tmp_path, name, text)
    with pytest.raises(TraceError, match=phrase) as info:
        read_trace(path, fmt)
    assert str(path) in str(info.value)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="azure, mooncake, plain"):
        read_trace(FIXTURES / "azure_conv_head.csv", "burstgpt")  # type: ignore[arg-type]


def test_trace_error_is_a_value_error():
    assert issubclass(TraceError, ValueError)


# ------------------------------------------------------------ properties

rows = st.lists(
    st.tuples(st.integers(0, 10**7).map(lambda ms: ms / 1000), st.integers(1, 200_000), st.integers(0, 5000)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(rows)
def test_plain_csv_round_trip(data):
    """Any valid rows come back sorted by arrival (stably), from 0, outputs clamped to >= 1."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.csv"
        path.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{a},{i},{o}\n" for a, i, o in data))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            tr = read_plain(path)
    expect = sorted(data, key=lambda r: r[0])
    assert len(tr) == len(data) and tr.arrival_s[0] == 0.0
    assert np.all(np.diff(tr.arrival_s) >= 0)
    assert np.allclose(tr.arrival_s, [a - expect[0][0] for a, _, _ in expect], atol=1e-9)
    assert tr.input_tokens.tolist() == [i for _, i, _ in expect]
    assert tr.output_tokens.tolist() == [max(o, 1) for _, _, o in expect]
    assert not tr.arrival_s.flags.writeable


# ------------------------------------------------------------ full shared traces


@needs_shared
@pytest.mark.parametrize(
    "rel, n, mean_in, mean_out, span_s",
    [
        ("azure_llm_2023/AzureLLMInferenceTrace_code.csv", 8819, 2047.85, 27.88, 3435.95),
        ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", 19366, 1154.70, 211.13, 3501.72),
        ("mooncake/conversation_trace.jsonl", 12031, 12035.06, 342.62, 3537.0),
        ("mooncake/synthetic_trace.jsonl", 3993, 15325.48, 149.12, 1022.03),
        ("sharegpt300/llama3_tokenizer.jsonl", 300, 857.46, 652.51, 29.12),
        ("sharegpt300/qwen3_tokenizer.jsonl", 300, 862.30, 664.95, 29.12),
    ],
)
def test_full_shared_traces(rel, n, mean_in, mean_out, span_s):
    tr = read_trace(SHARED_TRACES / rel)
    assert len(tr) == n and tr.notes == ()
    assert tr.input_tokens.mean() == pytest.approx(mean_in, abs=0.01)
    assert tr.output_tokens.mean() == pytest.approx(mean_out, abs=0.01)
    assert tr.arrival_s[-1] == pytest.approx(span_s, abs=0.01)
    if tr.hash_ids is not None:
        blocks = np.fromiter((len(h) for h in tr.hash_ids), np.int64, len(tr))
        assert (blocks == -(-tr.input_tokens // tr.hash_block_tokens)).all()


@needs_shared
def test_reading_azure_conv_is_fast():
    path = SHARED_TRACES / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    best = min(_timed(read_azure_csv, path) for _ in range(3))
    assert best < 0.5


@needs_shared
def test_full_sharegpt_lengths_columns():
    cols = read_token_columns(
        SHARED_TRACES / "sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        {"num_prefill_tokens": "input", "num_decode_tokens": "output"},
    )
    assert len(cols["num_prefill_tokens"]) == 30731
    assert cols["num_decode_tokens"].mean() == pytest.approx(438.71, abs=0.01)


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0
