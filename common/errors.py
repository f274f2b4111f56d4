"""One error tree for routers and clients; each class carries its AMQP condition.

- `RemoteProtocolError` and its children: the peer did something wrong (bad address, unsupported
  mode, oversized message, abusive credit). The router's core raises them; only the adapter turns
  them into a detach or close with the condition and a description a person can act on.
- `LocalError`: our side cannot serve the request right now (resource limits, shutting down); the
  peer did nothing wrong.
- `ClientError` and its children: what our client library raises to the application. A router's
  refusal keeps the condition the router gave (`LinkRefused.condition`, `PublishError.condition`).

Every condition the project puts on the wire or compares is written here, once: code elsewhere
names `errors.SomeError.condition`.
"""

from __future__ import annotations

from .vocab import Outcome


class OncemeshError(Exception):
    """Base of every error oncemesh raises; `condition` is the AMQP error condition it stands for."""
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


class IncompatibleVersion(NotImplementedMode):
    """A router whose inter-router protocol version is more than one apart from ours (docs/wire-protocol.md,
    "Versions"): the connection is refused, naming both versions."""


class DecodeError(RemoteProtocolError):
    """Bytes that do not decode (a malformed inter-router frame)."""

    condition = "amqp:decode-error"


class NotAllowed(RemoteProtocolError):
    """An operation this link or connection does not take (e.g. a transfer on a link that receives none)."""

    condition = "amqp:not-allowed"


class UnauthorizedAccess(RemoteProtocolError):
    """The peer is not who it must be for this listener (e.g. not an identified oncemesh router)."""

    condition = "amqp:unauthorized-access"


class MessageTooLarge(RemoteProtocolError):
    """A message above the router's max_message_size."""
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


class MissingMessageId(RemoteProtocolError):
    """A message without a message-id on a link identified by message-id (docs/clients.md): the
    router cannot tell it from a resend. The message is rejected, the link stays."""

    condition = "amqp:invalid-field"


class LocalError(OncemeshError):
    """We cannot serve this right now; the peer did nothing wrong."""


class ResourceLimitExceeded(LocalError):
    """A budget of ours is used up (connections, in-flight messages, causal state)."""
    condition = "amqp:resource-limit-exceeded"


class Redirect(LocalError):
    """This router is draining (docs/operations.md, "Rolling restart and upgrade"): connect to another
    one. The info fields name a neighbour's client address when it is known."""

    condition = "amqp:connection:redirect"


class LinkRedirect(LocalError):
    """The link-level redirect (an attach refused while the router drains)."""

    condition = "amqp:link:redirect"


class RelayMember(LinkRedirect):
    """A member of a shared subscription attached here, whose home is router `home`, reachable: the
    router relays it there (interrouter/members.py); an adapter that cannot takes it as a redirect."""

    def __init__(self, home: str, description: str) -> None:
        super().__init__(description)
        self.home = home


class ConnectionForced(LocalError):
    """We close the connection for a reason of our own (shutting down, replaced by a newer one, lost)."""

    condition = "amqp:connection:forced"


class ClientError(OncemeshError):
    """Base of what the client library raises to the application."""

    condition = "oncemesh:client-error"


class NoRouterAvailable(ClientError):
    """None of the router URLs accepted a connection within the reconnect timeout."""

    condition = "oncemesh:no-router-available"


class AuthenticationFailed(ClientError):
    """The router refused our credentials (or we refused the router's SCRAM proof)."""

    condition = "amqp:unauthorized-access"


class TlsFailed(ClientError):
    """A TLS handshake no retry mends: the router's certificate is not one we trust, or the port
    does not speak TLS (an amqps:// URL for a plain listener)."""

    condition = "amqp:unauthorized-access"


class LinkRefused(ClientError):
    """A router refused our link; `condition` is the AMQP error condition it gave."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


class PublishError(ClientError):
    """A message got an outcome other than ACCEPTED; `outcome` and `condition` say which (the condition
    the router gave, when it gave one)."""

    condition = "oncemesh:not-accepted"

    def __init__(self, gid: str, outcome: Outcome, condition: tuple[str, str] | None) -> None:
        detail = f": {condition[0]}: {condition[1]}" if condition else ""
        super().__init__(f"message {gid} was {outcome.name}{detail}")
        self.gid = gid
        self.outcome = outcome
        if condition is not None:
            self.condition = condition[0]
        self.description = condition[1] if condition else ""


# conditions the router puts on outcomes (not exceptions)
DELIVERY_LIMIT = "oncemesh:delivery-limit-exceeded"
SUBSCRIBER_REJECTED = "oncemesh:subscriber-rejected"
UNDELIVERABLE = "oncemesh:undeliverable-here"
