"""The manager: the REST API and the state side (reports applied, repairs) over PostgreSQL.

Where things are handled:
* HTTP: ``app`` wires everything; ``api/`` holds the routes (thin) and their schemas;
  ``commands`` (creates, stops, restarts; ``create_groups`` commits single creates together,
  ``admission`` bounds them) are the operations behind them;
  ``kinds`` validates a create's args against what the live services announce.
* The state side, a child process of the API's (``state.supervisor`` from the API's side,
  ``state_side`` inside it, which runs ``state/`` and ``repairs/``): ``state/`` applies
  service reports (``state/consumer`` takes them off the queue, ``state/rules`` dispatches
  each one to ``state/service_reports`` or ``state/observer_reports``, which share
  ``state/context``;
  ``state/rows`` reads and writes the rows, ``state/probation``, ``state/adoption``,
  ``state/follow_ups``);
  ``repairs/`` holds the periodic repairs, one file each, run by ``repairs/loop``, which runs
  the balancer's round too (``balance/``: its plan, its SQL, its rounds, the hand-overs);
  ``state/scheduler`` fires scheduled starts and stops (``schedule`` holds their rules);
  ``queue_waker`` keeps big start queues awake.
* The broker: ``broker`` (the manager's connection: publishes, the state consumer) and
  ``broker_probes`` (questions asked on connections of their own), ``broker_startup`` (a
  certificate refused at start-up is an exit, not a wait); ``start_messages`` builds start messages
  and ``start_publisher`` publishes every one; ``create_result`` is what a create answers.
* ``db/``: the models, the engines, the error classification, and the SQL, one module per
  subject (``db/observers``, ``db/creates``, ``db/schedule``, ``db/services``, ``db/events``
  for the history, ``db/digests``, ...): routes, commands, rules and repairs call them; only
  ``state/rows`` (the state consumer's locked rows) and ``balance/fleet`` write their own. A
  ``manager.db`` module is imported by its name (``from manager.db import observers``), or as
  ``<name>_rows`` where that name is taken (``schedule_rows``, ``service_rows``).
  ``metrics`` serves ``/metrics``.
"""
