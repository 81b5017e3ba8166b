"""The process shell: command line, service wiring, embedded Postgres and migrations, status,
retention, the demo. It imports the stages; nothing imports it.
"""
