"""The app's logic without Streamlit: scenarios, runs, comparison, planning, operations, calibration, hardware."""
