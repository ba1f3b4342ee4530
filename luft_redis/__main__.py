"""``python -m luft_redis``: the ``luft-redis`` command (:mod:`luft_redis.tools.cli`)."""

from __future__ import annotations

from luft_redis.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
