"""Search over plans: the analytic estimate (tier 1) and the what-if ranking."""
