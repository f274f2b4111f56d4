"""The management protocol's wire vocabulary (docs/operations.md, "oncemesh stat"), shared by the
router (router/management.py answers) and `oncemesh stat` (clients/stat.py asks).

A request is an AMQP message sent to the reserved address `$management` on a link the client
attaches with that target. Its application properties name the `operation` (`QUERY`) and the
`type` of view; its body, if any, is a map of options (`limit`: rows at most; `all`: ended
subscriptions too). Its `reply-to` names the source address of a receiver link the client attached
on the same connection: either the fixed address `$management` or a dynamic source (the router
names it, as for AMQP request/response with a temporary reply queue). The answer comes on that
link, pre-settled, with `correlation-id` set to the request's correlation-id (else its message-id)
and application properties `statusCode` (HTTP-like: 200, 400, 403, 404) and `statusDescription`
(the AMQP Management draft's names). Its body is a map: `router` (the answering router's id),
`type`, `columns` (names), `rows` (lists of values in column order), `total` (rows there were) and
`truncated` (more than `limit`).
"""

from __future__ import annotations

MANAGEMENT_ADDRESS = "$management"
REPLY_PREFIX = "$management/reply/"  # dynamic reply sources are named under it

# request application properties
OPERATION = "operation"
TYPE = "type"
QUERY = "QUERY"

# response application properties
STATUS_CODE = "statusCode"
STATUS_DESCRIPTION = "statusDescription"

OK = 200
BAD_REQUEST = 400
FORBIDDEN = 403
NOT_FOUND = 404

VIEWS: dict[str, str] = {
    "router": "this router: identity, readiness, counts",
    "connections": "client connections: peer address, container id, user, TLS, links",
    "links": "client links: role (publisher, subscriber, management), topic, credit, unsettled, backlog",
    "topics": "topics known here: order, subscriptions, publishers here, messages in flight",
    "subscriptions": "the subscription table: state, home router, owner, backlog held here",
    "peers": "the other routers: reachable, direct link up, incarnation, table synced",
    "inflight": "delivery records held here, oldest first: origin, age, outcome, parts pending",
    "orders": "total-order streams: algorithm, sequencer or view, numbered, waiting here",
}
DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000
