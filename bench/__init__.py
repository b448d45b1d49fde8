"""Benchmarks of the orchestrator's design.

* ``bench.raw`` — the raw broker limit: nothing but aio-pika and RabbitMQ, the same scheduling
  trick the product uses (unacked deliveries as leases, prefetch as capacity), so the product's
  numbers can be compared against it.
"""
