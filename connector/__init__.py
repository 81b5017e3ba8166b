"""Lead Routing Connector: race-free, fair lead assignment coordinated in PostgreSQL."""

__version__ = "0.1.0"
