"""The management protocol's wire vocabulary (docs/operations.md, "oncemesh stat"), shared by the
router (router/management.py answers) and `oncemesh stat` (clients/stat.py asks).

A request is an AMQP message sent to the reserved address `$management` on a link the client
attaches with that target. Its application properties name the `operation` (`QUERY`) and the
`type` of view; its body, if any, is a map of options (`limit`: rows in the answer, at most
`PAGE_MAX`; `offset`: rows skipped, for the next page; `all`: ended subscriptions too). Its `reply-to` names the source address of a receiver link the client attached
on the same connection: `$management`, an address of its own under `$management/` (unique on the
connection), or a dynamic source (the router names it, as for AMQP request/response with a
temporary reply queue). The answer comes on that
link, pre-settled, with `correlation-id` set to the request's correlation-id (else its message-id)
and application properties `statusCode` (HTTP-like: 200, 400, 403, 404) and `statusDescription`
(the AMQP Management draft's names). Its body is a map: `router` (the answering router's id),
`type`, `columns` (names), `rows` (lists of values in column order), `total` (rows there are),
`offset` and `truncated` (more rows after these).
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
# rows in one answer at most: Proton encodes an AMQP value of at most ~65,000 nodes (a view of
# 4,500 rows of 15 columns fails to encode), so larger views are read page by page (`offset`)
PAGE_MAX = 2000
MAX_ROWS = 1_000_000  # what `oncemesh stat --limit` may ask for in all, page by page
