"""Prefill/decode disaggregation: the KV-transfer plan and fabric checks (pd), max-min fair link
sharing (fabric), and the PD proxy that pairs prefill and decode instances at run time (pd_proxy).
"""
