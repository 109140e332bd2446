"""The strategy search: legal spaces (space), stage split DP (stages), ILPs (ilp), driver."""
