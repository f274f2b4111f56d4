"""The total-order streams' durable state on disk: per router and topic, two small files (Lamport) or
one journal (the sequencer).

The Lamport stream's member keeps its votes and the view it installed (`LamportNode.snapshot`: a
promise, a ballot, an accepted decision, the last commit) so that a restart is not amnesic. The
mesh node hands a snapshot over only when it changed (view changes: rare, never per message), once
per pass and before the pass's frames leave (a vote must be on disk before it is cast); this
store writes it whole, fsynced, by atomic rename (as `subscriptions.SubscriptionStore`), and
measures what that costs. Files: `<state_dir>/<router>.order.<topic, %-quoted>.json` (the votes:
promise, ballot seen, installed view, lives; rewritten on every new promise) and `....decisions.json`
(the accepted decision and the last commit, which carry histories: rewritten only when they
change, and first, so that the small file never names a decision the big one lacks).

The sequencer's member changes its votes per batch (each acceptance), so rewriting a file per change
would cost what the history weighs: its votes go to a journal, `<router>.order.<topic>.seq.jsonl`,
whose first line is the whole state (`SequencerNode.snapshot`) and each later line what changed
(`SequencerNode.take_journal`), appended and fdatasync'ed once per pass before that pass's frames
leave; the file is written again whole (atomic rename) when the compaction base moves, so it holds
the votes from the base on. A torn last line (a crash while appending) is the vote of a message that
never left: it is ignored.
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

from ..common.durable import write_durably
from ..common.errors import OncemeshError
from ..router.order.lamport import Snapshot
from ..router.order.sequencer import Journal, SeqState
from .codec import FrameError
from .lamportcodec import decisions_from_json, decisions_to_json, snapshot_from_json, snapshot_to_json
from .ordercodec import journal_to_json, seqstate_from_json, seqstate_to_json

log = logging.getLogger("oncemesh.router")
SLOW_WRITE_MS = 100.0  # a state write (fsynced) slower than this is logged as a warning


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
        self._write(self.path(topic, part), json.dumps(doc, separators=(",", ":")).encode(), topic,
                    part or "votes")

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

    # -- the sequencer's part --------------------------------------------------------------------
    def sequencer_restore(self, topics: list[str]) -> dict[str, SeqState]:
        """The votes earlier lives of this router wrote for these topics (a topic without a file: none)."""
        out: dict[str, SeqState] = {}
        for t in topics:
            p = self.path(t, ".seq").with_suffix(".jsonl")
            try:
                raw = p.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise OrderStateError(f"order state {p} unreadable: {exc}") from exc
            lines = raw.split(b"\n")
            docs: list[object] = []
            for k, line in enumerate(lines):
                if not line:
                    continue
                try:
                    docs.append(json.loads(line))
                except ValueError as exc:
                    if k == len(lines) - 1:  # the last line, torn by a crash: its frames never left
                        log.warning("order.state_torn_line topic=%s file=%s: ignored", t, p)
                        break
                    raise OrderStateError(f"order state {p} line {k + 1} unreadable: {exc}") from exc
            try:
                out[t] = seqstate_from_json(docs)
            except FrameError as exc:
                raise OrderStateError(f"order state {p}: {exc}") from exc
            log.info("order.state_restored topic=%s life=%d votes=%d", t, out[t].life, len(out[t].votes))
        return out

    def persist_sequencer(self, topic: str, item: SeqState | list[Journal]) -> None:
        """A whole state (written anew, atomically) or what changed since (appended); fsynced."""
        if isinstance(item, SeqState):
            self._write(self.path(topic, ".seq").with_suffix(".jsonl"),
                        json.dumps(seqstate_to_json(item), separators=(",", ":")).encode() + b"\n", topic, "seq")
            return
        if not item:
            return
        t0 = time.perf_counter()
        data = b"".join(json.dumps(journal_to_json(j), separators=(",", ":")).encode() + b"\n" for j in item)
        fd = os.open(self.path(topic, ".seq").with_suffix(".jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._measure(t0, len(data))

    def _write(self, p: Path, data: bytes, topic: str, part: str) -> None:
        t0 = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        write_durably(p, data)
        ms = self._measure(t0, len(data))
        # (once a second per ordered topic while it numbers: routine, not for the operational log at
        # INFO, which it filled by ~25 MB a day on its own; a slow write is worth a warning)
        log.log(logging.WARNING if ms >= SLOW_WRITE_MS else logging.DEBUG,
                "order.state_written topic=%s part=%s bytes=%d ms=%.2f", topic, part, len(data), ms)

    def _measure(self, t0: float, n: int) -> float:
        ms = (time.perf_counter() - t0) * 1000
        st = self.stats
        st["writes"] += 1
        st["bytes"] += n
        st["write_ms_total"] += ms
        st["write_ms_max"] = max(st["write_ms_max"], ms)
        return ms
