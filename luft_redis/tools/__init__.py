"""Tools built on the library, kept apart from its core.

- :mod:`luft_redis.tools.cli`: the ``luft-redis`` command line tool (``python -m luft_redis``);
- :mod:`luft_redis.tools.doctor`: ``check_server``, is a Redis safe for checkpoints?
- :mod:`luft_redis.tools.demo`: the fleet demo (``luft-redis demo``);
- :mod:`luft_redis.tools.server`: private ``redis-server`` processes and clusters for tests,
  benchmarks and the demo.

The core (``luft_redis.backend`` and the modules it uses) never imports from here; importing
this package imports none of the tools.
"""

from __future__ import annotations
