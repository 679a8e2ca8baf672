"""Checking the model against measurements: a bundle's load tests replayed (``command``, ``replay``, ``report``:
``epdsim calibrate validate``), the step-time model against kernel measurements no fit used (``perf_check``), and
the ShareGPT replay (``sharegpt_replay``).  Sits above the fit (it opens bundles as the fit does)."""
