"""The state side's repairs: each finds one kind of disagreement between the database, the
broker and the services, and mends it. One file per repair, each a ``base.Repair`` (a name,
a period, ``run``), run in order by the one loop in ``loop.py``:

* ``rebuild``: a broker that lost its data gets every start published again from PostgreSQL;
* ``restop``: stops still OnDeleting are broadcast again;
* ``liveness``: services whose heartbeats are late are judged by the broker, and the lost
  ones' deaths recorded;
* ``pending_starts``: starts a crash left unconfirmed are published again;
* ``lost_starts``: rows waiting for a start that is in no queue get it published again;
* ``unknown``: observers running with no row are described by their service, to adopt them;
* ``housekeeping``: probations ended, applied-message ids forgotten, history pruned
  (``retention``), the triggers' deltas folded;
* ``balance``: the load evened and drains carried out (``manager/balance/``).

``manager/queue_waker.py`` is not a repair: it keeps big start queues awake at its own pace.
"""
