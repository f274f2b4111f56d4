"""One error tree; each class carries the AMQP condition the adapter puts on the wire.

`RemoteProtocolError` and its children: the peer did something wrong (bad address, unsupported
mode, oversized message, abusive credit). The core raises them; only the adapter turns them into a
detach or close with the condition and a description a person can act on. `LocalError`: our side
cannot serve the request right now (resource limits); the peer did nothing wrong.
"""

from __future__ import annotations


class OncemeshError(Exception):
    condition = "amqp:internal-error"


class RemoteProtocolError(OncemeshError):
    """The peer broke a rule; the offending link or connection is closed with `condition`."""

    condition = "amqp:invalid-field"


class InvalidAddress(RemoteProtocolError):
    condition = "amqp:invalid-field"


class ReservedAddress(RemoteProtocolError):
    """Addresses starting with `$` or `_` belong to the routers."""

    condition = "amqp:unauthorized-access"


class NotImplementedMode(RemoteProtocolError):
    condition = "amqp:not-implemented"


class MessageTooLarge(RemoteProtocolError):
    condition = "amqp:link:message-size-exceeded"


class TransferLimitExceeded(RemoteProtocolError):
    condition = "amqp:link:transfer-limit-exceeded"


class LinkStolen(RemoteProtocolError):
    """Another link with the same identity attached elsewhere; this one is detached."""

    condition = "amqp:link:stolen"


class NotFound(RemoteProtocolError):
    condition = "amqp:not-found"


class PreconditionFailed(RemoteProtocolError):
    condition = "amqp:precondition-failed"


class LocalError(OncemeshError):
    """We cannot serve this right now; the peer did nothing wrong."""


class ResourceLimitExceeded(LocalError):
    condition = "amqp:resource-limit-exceeded"


# conditions the router puts on outcomes (not exceptions)
DELIVERY_LIMIT = "oncemesh:delivery-limit-exceeded"
SUBSCRIBER_REJECTED = "oncemesh:subscriber-rejected"
UNDELIVERABLE = "oncemesh:undeliverable-here"
