"""Observer kinds for the orchestrator's tests."""
