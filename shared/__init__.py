"""Code shared by the manager and the observer services.

Contracts (``messages``), AMQP topology (``topology``), the settings every process shares
(each side adds its own: ``manager.settings``, ``observer_service.settings``), errors and the
observer plug-in API (``observer_api``). Imports neither FastAPI nor SQLAlchemy.
"""

__version__ = "0.1.0"
