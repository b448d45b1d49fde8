"""The observer service: runs observers, scheduled by RabbitMQ (an unacked start is the lease).

Where things are handled:
* ``service``: the run loop: sessions, heartbeats, inventories, control commands (stops,
  isolation, introductions) and the graceful stop; ``__main__`` is the entry point.
* The broker session: ``session`` (the publish connection, the outbox loop, settles) and
  ``holding`` (the holding connection on its own thread, ``loop_thread``: start consumers,
  the control queue, the lease round trips, consumer cancels, refused start queues);
  ``start_consumers`` consumes the start queues under the manager's placement (priority,
  cordon) within the channel's window; ``start_channel`` hands start deliveries to a plain
  function; ``lease`` is the fencing lease; ``refusals`` says what the broker refuses for good;
  ``queue_watch`` tells a deleted start queue (its starts with it) from one merely out of reach.
* The observers: ``inbox`` (the start deliveries the service hands it, admitted into the
  runner in order, in chunks), ``runner`` (starting, stopping, fencing, handing over),
  ``stop_memory`` (broadcast stops of observers not here yet), ``declines`` (starts this
  service cannot run, handed on to one that can), ``probation`` (an observer moved into a
  child process in place), ``observer`` (one running observer, its context and
  supervision), ``registry`` (the running ones, by id, with each session's digest),
  ``isolation`` and ``child`` (process isolation), ``settle`` (acks once a report is
  confirmed), ``start_log``.
* Reports and events: ``outbox`` (the ordered state reports), ``emits`` (observers' events).
* The process: ``capacity`` (``auto`` sizing), ``metrics``, ``health`` (``/metrics``,
  ``/healthz``, ``/readyz`` on a thread of their own), ``watchdog`` (loop lag),
  ``gc_policy`` (garbage-collector pauses).
"""
