"""What replicas share through Redis: a guarded connection, a checksummed byte store with a
budget, a record log, and the wiring that lets every replica's tiers learn from the others.

Everything here is optional (``pip install 'vlmcache[redis]'``) and off unless
``redis_url`` is set; see docs/redis.md.
"""
