"""Encode/prefill/decode: image workloads (multimodal), the vision encoder's cost (vision, encoder),
the encoder tier's configuration (epd_config, epd) and the proxy that routes images and embeddings
at run time (epd_flow).
"""
