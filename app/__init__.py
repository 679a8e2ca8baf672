"""epdsim's what-if planner (Streamlit): pages, charts, reports; logic in app.services."""
