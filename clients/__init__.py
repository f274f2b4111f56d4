"""The client library (publisher, subscriber, their state directory) and the put/get/subscribe/
unsubscribe commands. Users import it through `oncemesh`."""
