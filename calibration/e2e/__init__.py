"""End-to-end validation on measured serving runs (``epdsim validate-e2e``): the runs as scenarios (``rows``), runs
beyond the hardware (``physics``) or made with speculative decoding (``spec``), the scores (``score``), the
engines' end-to-end terms (``fit``) and the command and reports (``report``)."""
