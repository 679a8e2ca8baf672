"""Calibration: fit the performance models' efficiency curves to measured kernel and engine timings.

Sub-packages, in the order of the flow (tests/test_import_layers.py holds each to its layer):

- ``harness``: drive a real vLLM server (launch or attach), measure it, record a bundle;
- ``fit``: a bundle -> a calibration profile (``epdsim calibrate fit``); imports the harness only;
- ``validation``: a bundle replayed against its profile (``epdsim calibrate validate``) and the model
  against independent measurements; above the fit, whose bundle reading it shares;
- ``pd``: a prefill/decode pair (launch, router, run, its bundle and replay), built on the harness;
- ``kernels``, ``coldstart``, ``e2e``: fits and checks on published tables, start-up profiles and
  serving runs, each one ``python -m`` command; they need nothing of the others.

``cli`` (``epdsim calibrate``) sits on top and may import them all.
"""
