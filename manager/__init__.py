"""The manager: REST API, state consumer and background loops over PostgreSQL.

``app`` wires everything; ``api/`` holds the HTTP routes (thin); ``commands`` and
``queries`` the operations behind them; ``state/`` applies service reports; ``background``
the periodic repairs; ``broker`` is the only module that touches aio-pika; ``db/`` the
models and the engine.
"""
