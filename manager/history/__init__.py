"""The dashboard's history: the last hour of counts, rates and service loads, kept in the API
process's memory (``GET /api/history``, docs/operations.md "Dashboard").

``ring`` holds the samples and makes the rates (pure), ``moves`` counts failovers from the
history's ids (pure), ``sampler`` reads one sample every ``ORCH_HISTORY_SAMPLE_S``.
"""
