"""A prefill/decode (PD) pair of real vLLM servers, on the harness: the run's options (``options``), the pair's
launch (``launch``) and router (``router``), the run under load (``run``, ``python -m calibration.pd.run``), the PD
bundle it writes (``bundle``), its replay in the simulator (``replay``) and the ``epdsim calibrate`` forms (``cli``).
Imports the harness, nothing else of calibration."""
