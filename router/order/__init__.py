"""Ordering modes per topic: sans-IO cores, one module per algorithm.

- `sequencer`: total order by numbering, the sequencer chosen by the bully election; epochs and
  quorum acceptance keep numbering gap-free and unique across crashes, freezes and partitions.
- `lamport`: total order by Lamport clocks and acknowledgements (docs/ordering.md, "Total order by
  Lamport clocks").
- `causal`: causal hold-back with reduced version vectors (docs/ordering.md, "The cores for causal and
  total order").

- `total`: a total-order topic's stream as the delivery core walks it (numbers to records, starts).

The delivery core's side of a topic's order is a policy its pump asks (`policy`: the interface;
`modes`: the registry, topic -> mode): `fifo` (the default), `causal_policy`, `total_policy` (both
total orders: `sequencer` and `lamport` number a topic, the core walks the numbers alike).

Each is tested on its own (unit tests and a seeded simulator); the delivery core (`router.core`) and the
mesh node (`interrouter.node`) drive them.
"""
