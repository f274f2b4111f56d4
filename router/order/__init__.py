"""Ordering modes per topic (issue 7): sans-IO cores, one module per algorithm.

- `sequencer`: total order by numbering, the sequencer chosen by the bully election; epochs and
  quorum acceptance keep numbering gap-free and unique across crashes, freezes and partitions.
- `lamport`: total order by Lamport clocks and acknowledgements (seed 002, section 2.2).
- `causal`: causal hold-back with reduced version vectors (seed 003).

They are building blocks: each is tested on its own (unit tests and a seeded simulator of its own);
wiring them into the delivery core (`router.core`) is separate work.
"""
