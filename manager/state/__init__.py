"""The manager's state side: what applies service reports. The process that runs it with
the repairs is ``manager/state_side.py`` (``python -m manager.state_side``), above both;
``supervisor`` is the API process's handle on it (spawn, watch, restart, stop). Inside it,
``leadership`` decides whether this manager's state side runs at all (of several managers,
one leads), ``consumer`` takes the state queue's batches and ``rules`` dispatches each report
(to ``service_reports`` and ``observer_reports``, which share ``context``: the transaction's
rows and the notes in memory the repairs read too); ``rows``
writes a batch's observer rows back, ``follow_ups`` publishes what a batch decided,
``probation`` and ``adoption`` are the rules' helpers (their SQL is in ``manager/db``),
``declines`` the memory of starts services declined (the lost-start repair reads it);
``scheduler`` starts Scheduled observers and stops expired ones when due.

Importing this package must stay light: the supervisor is imported before FastAPI.
"""
