"""The observer service: hosts observers as asyncio tasks, scheduled by RabbitMQ.

Modules: ``session`` owns every aio-pika object of one broker connection; ``lease`` the
fencing lease; ``outbox`` the ordered queue of state reports; ``runner`` the running
observers; ``service`` wires them into the reconnect loop; ``__main__`` is the entry point.
"""
