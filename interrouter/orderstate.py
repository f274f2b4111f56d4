"""The total-order streams' durable state on disk: one small file per router and topic.

The Lamport stream's member keeps its votes and the view it installed (`LamportNode.snapshot`: a
promise, a ballot, an accepted decision, the last commit) so that a restart is not amnesic. The
mesh node hands a snapshot over only when it changed (view changes: rare, never per message), once
per pass and before the pass's frames leave (a vote must be on disk before it is cast); this
store writes it whole, fsynced, by atomic rename (as `subscriptions.SubscriptionStore`), and
measures what that costs. Files: `<state_dir>/<router>.order.<topic, %-quoted>.json` (the votes:
promise, ballot seen, installed view, lives; rewritten on every new promise) and `....decisions.json`
(the accepted decision and the last commit, which carry histories: rewritten only when they
change, and first, so that the small file never names a decision the big one lacks).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..common.errors import OncemeshError
from ..router.order.lamport import Snapshot
from .codec import FrameError
from .lamportcodec import decisions_from_json, decisions_to_json, snapshot_from_json, snapshot_to_json

log = logging.getLogger("oncemesh.router")


class OrderStateError(OncemeshError):
    """An order-state file cannot be read (damaged, or of another version): the router refuses to
    start rather than vote with a memory it does not have. Remove the file to restart amnesic."""


class OrderStore:
    def __init__(self, state_dir: Path, me: str) -> None:
        self.dir = state_dir
        self.me = me
        self.stats: dict[str, float] = {"writes": 0, "bytes": 0, "write_ms_total": 0.0, "write_ms_max": 0.0}
        self._decisions: dict[str, tuple[object, object]] = {}  # what the decisions file holds

    def path(self, topic: str, part: str = "") -> Path:
        return self.dir / f"{self.me}.order.{quote(topic, safe='')}{part}.json"

    def load(self, topic: str, part: str = "") -> dict[str, Any] | None:
        p = self.path(topic, part)
        try:
            with open(p, encoding="utf-8") as f:
                doc: dict[str, Any] = json.load(f)
                return doc
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise OrderStateError(f"order state {p} unreadable: {exc}") from exc

    def save(self, topic: str, doc: dict[str, Any], part: str = "") -> None:
        t0 = time.perf_counter()
        p = self.path(topic, part)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        data = json.dumps(doc, separators=(",", ":")).encode()
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        ms = (time.perf_counter() - t0) * 1000
        st = self.stats
        st["writes"] += 1
        st["bytes"] += len(data)
        st["write_ms_total"] += ms
        st["write_ms_max"] = max(st["write_ms_max"], ms)
        log.info("order.state_written topic=%s part=%s bytes=%d ms=%.2f", topic, part or "votes", len(data), ms)

    # -- the Lamport streams' part ---------------------------------------------------------------
    def lamport_restore(self, topics: list[str]) -> dict[str, Snapshot]:
        """What earlier lives of this router wrote for these topics (a topic without a file: none)."""
        out: dict[str, Snapshot] = {}
        for t in topics:
            doc = self.load(t)
            if doc is None:
                continue
            big = self.load(t, ".decisions")
            try:
                snap = snapshot_from_json(doc)
                if big is not None:
                    accepted, commit = decisions_from_json(big)
                    snap = replace(snap, accepted=accepted, commit=commit)
            except FrameError as exc:
                raise OrderStateError(f"order state {self.path(t)}: {exc}") from exc
            out[t] = snap
            self._decisions[t] = (snap.accepted, snap.commit)
            log.info("order.state_restored topic=%s view=%s", t, list(out[t].installed))
        return out

    def persist_lamport(self, topic: str, snap: Snapshot) -> None:
        held = self._decisions.get(topic)
        if held is None or held[0] is not snap.accepted or held[1] is not snap.commit:
            self.save(topic, decisions_to_json(snap.accepted, snap.commit), ".decisions")
            self._decisions[topic] = (snap.accepted, snap.commit)
        self.save(topic, snapshot_to_json(replace(snap, accepted=None, commit=None)))
