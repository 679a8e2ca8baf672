"""Sweeps: a scenario run at a list of offered request rates, or with one knob set to a list of values.

``epdsim sweep`` (:mod:`simulator.cli.sweep`) and the app's Sweep page (:mod:`app.services.sweep`) build
the points (:mod:`simulator.sweep.prepare`, :mod:`simulator.sweep.points`; ``--rates auto``:
:mod:`simulator.sweep.ladder`), run them on the planner's executors (:mod:`simulator.sweep.run`) and find
the knee (:mod:`simulator.sweep.knee`).  docs/sweep.md describes the figures and the rules.  This package
re-exports nothing, so that the command line's parser can read the limits of the light modules without
loading pandas and the simulator.
"""
