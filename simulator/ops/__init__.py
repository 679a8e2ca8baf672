"""Operations: Kubernetes pods and probes, cold starts, autoscaling policies, faults, and the
``operations`` block that configures them.

Read at resolve time (scenario) and used by the engine; imports nothing from the engine.
"""
