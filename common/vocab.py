"""Wire vocabulary shared by routers, the mesh and clients: message outcomes and the final
notifications. The AMQP symbols of oncemesh's extensions (link and connection properties, a
redirect's fields) are Proton values: they are in `symbols`, so that this module, and the sans-IO
core that imports it, loads no Proton."""

from __future__ import annotations

from enum import IntEnum


class Outcome(IntEnum):
    """What a publisher is told of a message (docs/promises.md, promise 2: ACCEPTED only once every subscription in force accepted it or ended)."""
    ACCEPTED = 1
    REJECTED = 2
    RELEASED = 3
    MODIFIED = 4


# (module constants for per-message code: see router.core.S_QUEUED)
O_ACCEPTED, O_REJECTED, O_RELEASED, O_MODIFIED = Outcome.ACCEPTED, Outcome.REJECTED, Outcome.RELEASED, Outcome.MODIFIED


# a publisher link's identity (link property oncemesh.identity; docs/clients.md): "tag", the
# default (container id, link name, delivery tag), or "message-id" (the message's own id)
TAG = "tag"
MESSAGE_ID = "message-id"
IDENTITIES = (TAG, MESSAGE_ID)


# final notifications: pre-settled control transfers to our subscribers naming ids accepted on an
# earlier link that are now final (tags start with "$", which no global id does)
FINAL_SUBJECT = "oncemesh.final"
FINAL_TAG_PREFIX = "$final:"


# the `info` of a router's `subscribed` / `resumed` settlement-log line for a subscription with a JMS
# selector, and how our subscriber's begins (docs/settlement-log.md): only what the selector selects is owed to it, which the origins'
# owed sets say per message; the judge pairs such a life by those alone, not by its filter
SELECTIVE = "selector"
