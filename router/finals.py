"""What a router remembers of messages that became final after their records were freed.

A late copy, a late presenter or a message waiting for its predecessor must learn that a gid is
final (never hand it again, never wait for it), for `final_memory` seconds after it became final.

The memory is a plain dict gid -> when it became final, in the order added: adding is one C-level
store and membership one C-level lookup (both on the per-message path; a dict subclass would lose
the interpreter's specialised paths). `forget_finals` walks it once from the front, which costs the
gids forgotten plus the slots deleted earlier that the dict has not reclaimed yet (skipped in C, a
few ms per million at most; a resize reclaims them). It must not pop from the front with
`next(iter(d))` per gid: every such call walks every deleted slot again, quadratic in what was
forgotten (with a million gids each tick's purge grew from 0.26 s to 0.87 s in five rounds, and a
loop pass past the idle timeout closed every connection).

Bound: at most `max_gids` gids (the oldest forgotten first when there are more), each about 150
bytes with its key string: ~150 MB at the default million. Compacting it further (per-publisher
ranges) is future work.
"""

from __future__ import annotations


def forget_finals(finals: dict[str, float], before: float, max_gids: int) -> int:
    """Forget, from the front of `finals` (gid -> when it became final, in the order added), the gids
    that became final before `before` (up to the first that did not: a gid final again keeps its
    place), and the oldest beyond `max_gids`. Returns how many."""
    excess = len(finals) - max_gids
    dead = []
    for gid, t in finals.items():  # one pass from the front
        if t >= before and excess <= 0:
            break
        dead.append(gid)
        excess -= 1
    for gid in dead:
        del finals[gid]
    return len(dead)
