"""Fitting a calibration bundle (``epdsim calibrate fit``): reading it (``inputs``), its measurement points
(``points``), predictions through the simulator (``predict``), the solver (``solver``), the front end
(``frontend``), the host check (``host``), start-up and KV-transfer overrides (``startup``, ``transfer``), the fit's
record (``result``) and what it writes (``report``); ``command`` runs a bundle end to end.  Imports the harness only."""
