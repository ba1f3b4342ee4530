"""``python -m luft_redis``: the ``luft-redis`` command line tool (see :mod:`luft_redis.cli`)."""

from __future__ import annotations

from luft_redis.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
