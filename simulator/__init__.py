"""epdsim simulator: performance models, SimPy serving engine, scenarios and metrics."""
