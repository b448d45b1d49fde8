"""``python -m cli``: the same as the ``orchestrator`` console script."""

from cli.main import main

main()
