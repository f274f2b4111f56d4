"""oncemesh: exactly-once publish/subscribe over a federated network of AMQP 1.0 routers."""
