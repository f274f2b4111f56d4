"""Client state in a directory (SQLite): identity, the publisher outbox, the subscriber dedup store.

Why SQLite: one file, transactions, crash-safe with WAL; `synchronous=NORMAL` survives a crash of
the process (our fault model: client processes are SIGKILLed; machines are not) at a fraction of
the cost of an fsync per message. Without a state directory the same code runs on `:memory:`.

- identity: the container-id; the same state directory means the same client.
- outbox: every message a publisher sent and has no final outcome for, with its tag, so that a
  restarted publisher resends exactly those (same tags -> same global ids -> merged by the routers).
- dedup: per subscription, the global ids handed to the application. `accepted` rows are accepted
  but not yet seen settled: they are presented when the subscription resumes. `settled` rows are
  kept for `retention` seconds as a last line of defence against a late resend.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

SCHEMA = 1


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "oncemesh" / "client"


class ClientState:
    def __init__(self, state_dir: Path | str | None, retention: float = 3600.0) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.retention = retention
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path = str(self.state_dir / "client.sqlite")
        else:
            path = ":memory:"
        self._lock = threading.RLock()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=10000")
        self._init_schema()
        self.container_id = self._identity()
        self._last_purge = 0.0

    @property
    def durable(self) -> bool:
        return self.state_dir is not None

    def _init_schema(self) -> None:
        with self._lock:
            self.db.executescript("""
                CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS outbox (
                    link TEXT NOT NULL, seq INTEGER NOT NULL, tag BLOB NOT NULL, topic TEXT NOT NULL,
                    payload BLOB NOT NULL, created REAL NOT NULL, PRIMARY KEY (link, seq));
                CREATE TABLE IF NOT EXISTS pubseq (link TEXT PRIMARY KEY, next INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS dedup (
                    sub TEXT NOT NULL, gid TEXT NOT NULL, settled REAL, handed REAL NOT NULL,
                    PRIMARY KEY (sub, gid));
                CREATE INDEX IF NOT EXISTS dedup_settled ON dedup (settled);
                CREATE TABLE IF NOT EXISTS subs (
                    sub TEXT PRIMARY KEY, topic TEXT NOT NULL, link TEXT NOT NULL, expiry REAL,
                    created REAL NOT NULL);
            """)
            row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
            elif int(row[0]) != SCHEMA:
                raise RuntimeError(f"client state schema {row[0]} in {self.state_dir}, expected {SCHEMA}")

    def _identity(self) -> str:
        with self._lock:
            row = self.db.execute("SELECT value FROM meta WHERE key='container_id'").fetchone()
            if row is not None:
                return str(row[0])
            cid = f"oncemesh-{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
            self.db.execute("INSERT INTO meta VALUES ('container_id', ?)", (cid,))
            return cid

    def close(self) -> None:
        with self._lock:
            self.db.close()

    # ------------------------------------------------------------------ publisher
    def reserve_seqs(self, link: str, n: int) -> int:
        """Reserve n sequence numbers (tags) for a publisher link; returns the first."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute("SELECT next FROM pubseq WHERE link=?", (link,)).fetchone()
            first = int(row[0]) if row else 0
            self.db.execute("INSERT OR REPLACE INTO pubseq VALUES (?, ?)", (link, first + n))
            self.db.execute("COMMIT")
            return first

    def seqs_reserved(self, link: str) -> int:
        """The first sequence number not reserved yet for a publisher link: everything below it was
        used or skipped by an earlier run."""
        with self._lock:
            row = self.db.execute("SELECT next FROM pubseq WHERE link=?", (link,)).fetchone()
            return int(row[0]) if row else 0

    def outbox_add(self, rows: Iterable[tuple[str, int, bytes, str, bytes]],
                   meta: dict[str, str] | None = None) -> None:
        """Persist messages before their first send; `meta` is written in the same transaction."""
        now = time.time()
        with self._lock:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR REPLACE INTO outbox VALUES (?, ?, ?, ?, ?, ?)",
                                [(*r, now) for r in rows])
            if meta:
                self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(meta.items()))
            self.db.execute("COMMIT")

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            return str(row[0]) if row else None

    def outbox_remove(self, link: str, seqs: Iterable[int]) -> None:
        with self._lock:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM outbox WHERE link=? AND seq=?", [(link, s) for s in seqs])
            self.db.execute("COMMIT")

    def outbox(self, link: str | None = None) -> list[tuple[str, int, bytes, str, bytes]]:
        with self._lock:
            if link is None:
                cur = self.db.execute("SELECT link, seq, tag, topic, payload FROM outbox ORDER BY link, seq")
            else:
                cur = self.db.execute(
                    "SELECT link, seq, tag, topic, payload FROM outbox WHERE link=? ORDER BY seq", (link,))
            return [(str(a), int(b), bytes(c), str(d), bytes(e)) for a, b, c, d, e in cur.fetchall()]

    def outbox_links(self) -> list[tuple[str, str]]:
        with self._lock:
            cur = self.db.execute("SELECT DISTINCT link, topic FROM outbox ORDER BY link")
            return [(str(a), str(b)) for a, b in cur.fetchall()]

    # ------------------------------------------------------------------ subscriber
    def remember_subscription(self, sub: str, topic: str, link: str, expiry: float | None) -> None:
        with self._lock:
            self.db.execute("INSERT OR IGNORE INTO subs VALUES (?, ?, ?, ?, ?)",
                            (sub, topic, link, expiry, time.time()))

    def forget_subscription(self, sub: str) -> None:
        with self._lock:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM subs WHERE sub=?", (sub,))
            self.db.execute("DELETE FROM dedup WHERE sub=?", (sub,))
            self.db.execute("COMMIT")

    def subscriptions(self) -> list[tuple[str, str, str, float | None]]:
        with self._lock:
            cur = self.db.execute("SELECT sub, topic, link, expiry FROM subs ORDER BY created")
            return [(str(a), str(b), str(c), d) for a, b, c, d in cur.fetchall()]

    def seen(self, sub: str, gids: Iterable[str]) -> set[str]:
        """Which of `gids` were already handed to the application (accepted or settled)."""
        gl = list(gids)
        out: set[str] = set()
        with self._lock:
            for i in range(0, len(gl), 500):
                chunk = gl[i:i + 500]
                q = f"SELECT gid FROM dedup WHERE sub=? AND gid IN ({','.join('?' * len(chunk))})"
                out.update(r[0] for r in self.db.execute(q, (sub, *chunk)))
        return out

    def hand_over(self, sub: str, gids: Iterable[str]) -> None:
        """Record gids as handed to the application (accepted, not yet settled). Durable on return."""
        now = time.time()
        with self._lock:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR IGNORE INTO dedup VALUES (?, ?, NULL, ?)",
                                [(sub, g, now) for g in gids])
            self.db.execute("COMMIT")

    def mark_settled(self, sub: str, gids: Iterable[str]) -> None:
        now = time.time()
        with self._lock:
            self.db.execute("BEGIN")
            self.db.executemany("UPDATE dedup SET settled=? WHERE sub=? AND gid=? AND settled IS NULL",
                                [(now, sub, g) for g in gids])
            self.db.execute("COMMIT")
            if now - self._last_purge > 60:
                self._last_purge = now
                self.db.execute("DELETE FROM dedup WHERE settled IS NOT NULL AND settled < ?",
                                (now - self.retention,))

    def last_hand_over(self, sub: str) -> tuple[float, list[str]] | None:
        """The most recent hand-over still unsettled (its time and ids): the only one a crash can
        have cut off between its COMMIT and its settlement-log line."""
        with self._lock:
            row = self.db.execute("SELECT MAX(handed) FROM dedup WHERE sub=? AND settled IS NULL",
                                  (sub,)).fetchone()
            if row is None or row[0] is None:
                return None
            t = float(row[0])
            cur = self.db.execute("SELECT gid FROM dedup WHERE sub=? AND settled IS NULL AND handed=?", (sub, t))
            return t, [str(r[0]) for r in cur.fetchall()]

    def forget_hand_over(self, sub: str, gids: Iterable[str]) -> None:
        """Undo the record of a hand-over that never reached the application."""
        with self._lock:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM dedup WHERE sub=? AND gid=? AND settled IS NULL",
                                [(sub, g) for g in gids])
            self.db.execute("COMMIT")

    def handed(self, sub: str) -> list[str]:
        """Every id this subscription's store holds as handed over (settled or not), in hand-over order."""
        with self._lock:
            return [str(r[0]) for r in self.db.execute("SELECT gid FROM dedup WHERE sub=? ORDER BY handed, rowid",
                                                       (sub,))]

    def unsettled(self, sub: str) -> list[str]:
        """Ids accepted but not seen settled: presented when the subscription resumes."""
        with self._lock:
            cur = self.db.execute("SELECT gid FROM dedup WHERE sub=? AND settled IS NULL ORDER BY handed",
                                  (sub,))
            return [str(r[0]) for r in cur.fetchall()]
