"""Calibration: fit the performance models' efficiency curves to measured kernel and engine timings."""
