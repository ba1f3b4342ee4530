"""``luft-redis web``: a live web view of the runs under a prefix (the ``web`` extra).

:mod:`.server` starts it (uvicorn), :mod:`.app` is the Starlette app with its guards,
:mod:`.hub` the shared per-run view that feeds every viewer's event stream; ``static/`` holds
the page's JavaScript and CSS (no build step, shipped in the wheel). Importing this package
needs nothing beyond luft-redis; :mod:`.app` and :mod:`.server` need Starlette and uvicorn.
"""

from __future__ import annotations
