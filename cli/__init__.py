"""``orchestrator``: a command line client of the manager's HTTP API.

Deliberately only a client: it imports nothing of the manager, the observer service or
``shared`` (no FastAPI, SQLAlchemy, aio-pika or pydantic). It works on the API's plain JSON
bodies, so it runs anywhere the API can be reached and installs with ``pip install .`` alone
(the server's dependencies are the ``server`` extra); ``tests/system/test_cli.py`` checks both.

``main`` holds the typer app and the observer commands, ``fleet`` the commands about services
(list, drain, uncordon, watch), ``context`` what they share (consoles, the callback's state,
JSON output, a service by name), ``client`` the HTTP client (base URL, token, failures to exit
codes), ``times`` the durations of ``--run-for``, ``render`` the rich tables.

Exit codes: 0 success, 1 the API answered 4xx/5xx (or an id given was unknown), 2 usage error
(typer's), 3 the manager could not be reached.
"""
