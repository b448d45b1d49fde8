"""Applying service reports to the database (``rules``) and consuming them (``consumer``)."""
