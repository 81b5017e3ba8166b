"""The foundation every stage stands on: the org config, the connector's own errors, metrics
and the CRM ownership facts. Imports nothing from the stages or the shell.
"""
