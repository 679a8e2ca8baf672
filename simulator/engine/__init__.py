"""The one engine: instances and their scheduler state (instance, instance_lifecycle, instance_state,
dp_group), pools (opspool, opsencoder), arrivals, the run (opsengine, opsrun, engine's Recorder), what an
autoscaler sees (opsobserve), what a crash takes (opscrash), incarnations (opsrecord), and the results
tables (outcome, results, opsresults).

Sits above ops, pd and epd (it drives their pieces) and below run (one simulation).
"""
