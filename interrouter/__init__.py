"""Router to router: HELLO and failure detection, link state and paths, subscription gossip, the
mesh node that carries the delivery core's copies, acks and finals, the codecs, and the peer links."""
