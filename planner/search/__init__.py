"""The strategy search: legal spaces (space), stage split DP (stages), the recompute-count programme (ilp), driver."""
