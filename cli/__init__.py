"""``orchestrator``: a command line client of the manager's HTTP API.

Deliberately only a client: it imports nothing of the manager, the observer service or
``shared`` (no FastAPI, SQLAlchemy, aio-pika or pydantic), only ``orchestrator_client``, the
typed client programs use too. So it runs anywhere the API can be reached and installs with
``pip install .`` alone (the server's dependencies are the ``server`` extra);
``tests/system/test_cli.py`` checks both.

``main`` holds the typer app and the observer commands, ``fleet`` the commands about services
(list, drain, uncordon, watch), ``context`` what they share (consoles, the callback's state,
an answer as JSON or rendered), ``client`` the typed client of ``orchestrator_client`` with its
failures turned into exit codes and hints, ``times`` the durations of ``--run-for``, ``render``
the rich tables (from the answers as JSON, as ``--json`` prints them).

Exit codes: 0 success, 1 the API answered 4xx/5xx (or an id given was unknown), 2 usage error
(typer's), 3 the manager could not be reached.
"""
