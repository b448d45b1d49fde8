"""The balancer's home: even load and drains (docs/design.md, "Even load"). ``plan.py``
decides from the fleet ``fleet.py`` reads, ``rounds.py`` carries the decisions out each
round, and ``handovers.py`` remembers the hand-overs in flight so the start on the new service
is recorded as ``rebalanced``."""
