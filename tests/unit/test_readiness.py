"""/readyz's decision (router/readiness.py `ready_from`): ready exactly when the table is synced, the
peers are known and the settlement log can be written; mesh convergence is reported, never required
(it flips at every router whenever one router rejoins)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from oncemesh.router.readiness import ready_from

MESH = st.none() | st.fixed_dictionaries({"ready": st.booleans(), "converged": st.booleans(),
                                          "peers": st.lists(st.sampled_from("ABC"), unique=True)})


@given(st.booleans(), st.booleans(), MESH)
def test_ready_exactly_when_synced_peers_known_and_log_writable(synced: bool, writable: bool,
                                                                mesh: dict[str, Any] | None) -> None:
    ok, why = ready_from(synced, writable, mesh)
    assert ok == (synced and writable and (mesh is None or mesh["ready"]))
    assert why["accepting_publishers"] == (synced and writable)
    if mesh is None:
        assert "peers_known" not in why and "mesh_converged" not in why
    else:
        assert why["mesh_converged"] == mesh["converged"] and why["peers"] == mesh["peers"]
        assert why["peers_known"] == mesh["ready"]
