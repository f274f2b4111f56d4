"""Measurement and test harness: bench, demo, failover and convergence measurements, chaos runs, router
and client processes for tests. Product code (trio.testing style), outside the router."""
