"""``python -m connector``: the command line."""

from connector.shell.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
