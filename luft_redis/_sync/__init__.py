"""The sync front end's I/O: generated from :mod:`luft_redis.asyncio` by ``.ci/unasync.py``
(never edit these modules by hand). Their public names are the package's
(``from luft_redis import RedisCheckpointBackend``)."""
