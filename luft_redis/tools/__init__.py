"""Tools built on the library, kept apart from its core.

- :mod:`luft_redis.tools.cli`: the ``luft-redis`` command line tool (``python -m luft_redis``);
- :mod:`luft_redis.tools.doctor`: ``check_server``, is a Redis safe for checkpoints?
- :mod:`luft_redis.tools.demo`: the fleet demo (``luft-redis demo``);
- :mod:`luft_redis.tools.server`: private ``redis-server`` processes and clusters for tests,
  benchmarks and the demo;
- :mod:`luft_redis.tools.testing`: the pytest plugin (fixtures ``luft_backend``,
  ``luft_redis_server``, ...), loaded through the ``pytest11`` entry point.

The tools import the library, never the other way: no module of ``luft_redis`` outside this
package imports from here (``python -m luft_redis``, ``luft_redis/__main__.py``, only runs
the command). Importing this package imports none of the tools.
"""

from __future__ import annotations
