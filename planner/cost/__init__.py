"""The analytic cost model: pure functions that price one strategy."""
