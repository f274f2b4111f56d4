"""One router: the delivery core (sans-IO records, outcomes, resume, back-pressure), the subscription
table, the ordering cores (`order/`), and the adapter that drives them from the engine (`server`).

It imports only `oncemesh.common`; the mesh layer plugs in through the interface the router defines."""
