"""Cold starts: the coefficients fitted to start-up profiles (``fit``), the sourced real start-ups the ranges are
checked against (``cases``) and the leave-one-source-out check (``holdout``)."""
