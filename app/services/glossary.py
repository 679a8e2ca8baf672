"""What the app's terms mean, in one place: help texts of its inputs and the "What the terms mean" fold."""

from __future__ import annotations

TERMS = {
    "colocated": "Each instance runs both phases of a request, prefill (the prompt) and decode (the output "
    "tokens), on the same GPUs.",
    "PD": "Prefill/decode disaggregation: a prefill pool computes the prompt's KV cache and sends it over the "
    "KV connector and fabric to a decode pool, which generates the output. Prefill bursts no longer stall "
    "decoding, at the cost of a KV transfer and two pools to size.",
    "E+PD": "Encoder + colocated: a separate encoder pool turns each request's images into embeddings and sends "
    "them over the embedding-transfer fabric to colocated instances that prefill and decode.",
    "E+P+D": "Encoder + prefill + decode: the encoder pool feeds a prefill pool, which hands the KV cache to a "
    "decode pool; three pools, two transfers.",
    "TTFT": "Time to first token: from a request's arrival to its first output token (queueing, encoding, prefill "
    "and any transfer included).",
    "TPOT": "Time per output token after the first: (E2E - TTFT) / (output tokens - 1), per request.",
    "ITL": "Inter-token latency: the gap between two consecutive output tokens, over all tokens.",
    "SLO attainment": "The share of requests that completed and met every SLO target (TTFT and TPOT). The SLO is "
    "met when this share reaches the attainment target (90 % unless set).",
    "goodput": "Requests per second that complete within the SLO: throughput x SLO attainment. The planner's "
    "table estimates it analytically; its banner gives the simulated figure of the verified candidates.",
    "families": "The planner's kinds of deployment (colocated, prefill/decode, ...): it searches each family "
    "over the GPUs, TP degrees and instance counts on offer and keeps the cheapest that meets the SLO.",
    "TP / PP": "Tensor parallelism splits every layer over TP GPUs (more memory and bandwidth per instance, "
    "all-reduce per layer); pipeline parallelism splits the layers into PP stages. An instance uses "
    "TP x PP GPUs.",
    "DP / EP": "Attention data parallelism (vLLM --data-parallel-size, SGLang --enable-dp-attention) runs DP "
    "ranks of TP GPUs each, every rank with its own batch and KV cache; for MoE models the ranks step "
    "together through the expert layers. Expert parallelism places whole experts on EP GPUs and "
    "sends each token to its experts (all-to-all); vLLM's --enable-expert-parallel sets EP = DP x TP. "
    "An instance uses DP x TP GPUs.",
    "weights (dtype)": "bf16 is the default; fp8 halves the weights and speeds up the matrix products on GPUs with "
    "FP8 (H100, H200, B200, L40S...), which lets a model fit where bf16 does not; fp4/int4 halve "
    "them again where supported.",
    "KV cache dtype": "auto is what the engine release does for the checkpoint: the activation dtype (bf16/fp16), "
    "or the KV format a quantised checkpoint declares where the release follows it "
    "(docs/validation/memory.md); fp8 (vLLM --kv-cache-dtype fp8) halves the KV cache, so about "
    "twice the tokens fit in the same memory.",
    "seed": "Every random draw (arrivals, lengths, jitter, faults) comes from streams spawned from this seed: the "
    "same seed gives the same run; another seed shows the run-to-run spread.",
    "arrival process": "Poisson: independent arrivals at a mean rate. Bursty: gamma-distributed gaps with a "
    "coefficient of variation (cv 1 = Poisson, above 1 = burstier). Closed loop: a fixed "
    "number of users, each sending its next request when the last reply ends (as "
    "benchmark clients with --max-concurrency do).",
}


def help_for(*terms: str) -> str:
    """The definitions of ``terms`` joined, for a widget's ``help``."""
    return "\n\n".join(f"**{t}**: {TERMS[t]}" for t in terms)


def markdown() -> str:
    """Every definition as a Markdown list."""
    return "\n".join(f"- **{t}**: {text}" for t, text in TERMS.items())
