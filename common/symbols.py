"""The AMQP symbols of oncemesh's extensions (docs/wire-protocol.md): the link and connection
properties of the client extensions and of inter-router connections, and the info fields of a
redirect. Proton symbols (they go on the wire as AMQP symbols), so this module loads Proton: the
edges import it, the sans-IO core does not (the rest of the vocabulary is in `vocab`)."""

from __future__ import annotations

from proton import UNDESCRIBED, Array, Data, symbol

# link properties of the client extensions (resume, in-doubt declarations, ...)
PROP_CLIENT = symbol("oncemesh.client")  # our client library (understands final notifications)
PROP_RESUME = symbol("oncemesh.resume")  # subscriber: ids accepted but not seen settled
PROP_IN_DOUBT = symbol("oncemesh.in-doubt")  # publisher: tags it still holds in doubt
PROP_NEXT_SEQ = symbol("oncemesh.next-seq")  # publisher: the next counter-tag sequence number it uses
PROP_RESUMED = symbol("oncemesh.resumed")  # router -> subscriber: the subscription resumed
PROP_RECEIVED = symbol("oncemesh.received")  # publisher: send RECEIVED once a router holds a message
PROP_EPOCH = symbol("oncemesh.epoch")  # subscription epoch: answered on attach, presented on resume
PROP_CAUSAL_PAST = symbol("oncemesh.causal-past")  # publisher: [gid, topic] of its client's causal past
PROP_HANDED_LAST = symbol("oncemesh.handed-last")  # subscriber: per publisher link, the latest id handed over
PROP_IDENTITY = symbol("oncemesh.identity")  # publisher: "message-id": its messages are named by their message-id
# connection and link properties naming a router, and those of inter-router connections
PROP_ROUTER = symbol("oncemesh.router")
PROP_INCARNATION = symbol("oncemesh.incarnation")
PROP_MESH = symbol("oncemesh.mesh")
PROP_VERSION = symbol("oncemesh.version")  # inter-router: the protocol version the router speaks (absent: 1)
PROP_CLIENT_URL = symbol("oncemesh.client-url")  # inter-router: where the router's clients connect

# connection capabilities a router offers: ANONYMOUS-RELAY (a sender link with no target; each
# message's `to` names its topic), as Qpid JMS, Dispatch and Artemis name it
ANONYMOUS_RELAY = symbol("ANONYMOUS-RELAY")
# ... and SHARED-SUBS (receivers may share a subscription, router/groups.py: Qpid JMS creates a shared
# consumer only when the peer offers it)
SHARED_SUBS = symbol("SHARED-SUBS")
# (an array of symbols, as the field is typed)
ROUTER_CAPABILITIES = Array(UNDESCRIBED, Data.SYMBOL, ANONYMOUS_RELAY, SHARED_SUBS)  # type: ignore[arg-type]  # proton annotates Array's descriptor as PythonAMQPData, yet its own UNDESCRIBED (a Constant) is how it takes none

# a receiver's source filter holding a JMS message selector (the Apache filter registry; Qpid JMS's key
# "jms-selector"): by its descriptor, as a symbol or its ulong code
SELECTOR_FILTER = symbol("apache.org:selector-filter:string")
SELECTOR_FILTER_CODE = 0x0000468C00000004
SELECTOR_KEY = symbol("jms-selector")

# the info fields of a redirect condition (AMQP 1.0, amqp:connection:redirect and amqp:link:redirect)
REDIRECT_HOSTNAME = symbol("hostname")
REDIRECT_NETWORK_HOST = symbol("network-host")
REDIRECT_PORT = symbol("port")
REDIRECT_ROUTER = symbol("oncemesh.router")  # ours: the id of the router it points at
