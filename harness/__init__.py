"""The tools around the product: bench, demo, failover and convergence measurements, chaos and soak
runs, and the router and client processes they drive (procs.py, which the tests use too). Each is
loaded by its subcommand when it runs: a router process imports none of them."""
