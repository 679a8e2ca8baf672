"""Curves fitted to published measurement tables, one ``python -m`` command each: the step model's efficiency
curves (``tables``, ``fit``, ``profile``; ``bench_fit`` for a harness kernel bundle), all-reduce
(``comm_fit``), GEMM shapes (``gemm_shape_fit``), fused MoE (``moe_fit``), MLA and its sparse indexer (``mla_fit``,
``dsa_fit``), Gated DeltaNet (``gdn_fit``, with ``cli`` shared), and the engines' memory terms against their start-up
logs (``memory_fit``)."""
