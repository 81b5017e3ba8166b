"""The last module the fork server imports (testbed/processes.py ``PRELOAD``): importing it
moves everything imported before it out of the garbage collector's sight (``gc.freeze``).

Done once in the fork server, a forked child's collections never walk the preloaded modules,
and never write to their pages (which the child shares with the server until it writes): the
full collection a `connector` service makes as it starts (``settle_garbage_collector``) then
walks only what the child built itself.
"""

import gc

gc.freeze()
