"""Capture golden change deltas (script replies = change notices) written by the installed
luft-redis.

    .venv/bin/python tests/golden/make_deltas.py

writes ``tests/golden/deltas/<format>.json`` for the delta format this version writes (it
refuses to overwrite a file that exists: fixtures are never edited, a format change adds a new
file). For each run of ``make_fixtures.py`` (on fakeredis) the file holds every write's reply,
in order (base64), and the run's checkpoint as luft JSON after the last one.
``tests/test_golden.py`` applies every file's deltas and compares the result with that
checkpoint. The file of a format that a released version wrote is kept forever (a mixed fleet
publishes old-format notices); one replaced before any release goes with its reader (``L2``).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import fakeredis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_fixtures import RUN, run_full, run_minimal, run_saved

from luft_redis import RedisCheckpointBackend
from luft_redis._sync import backend as backend_module
from luft_redis.delta import FORMAT, parse_delta

HERE = Path(__file__).resolve().parent


def capture(make: Any) -> dict[str, Any]:
    client = fakeredis.FakeRedis()
    backend = RedisCheckpointBackend(client, watch=False)
    replies: list[bytes] = []

    def grab(payload: bytes) -> Any:  # every write's reply goes through parse_delta
        replies.append(bytes(payload))
        return parse_delta(payload)

    setattr(backend_module, "parse_delta", grab)  # noqa: B010
    try:
        make(backend)
    finally:
        setattr(backend_module, "parse_delta", parse_delta)  # noqa: B010
    cp = backend.get_checkpoint()
    assert cp is not None
    out = {
        "run_id": str(cp.run_id),
        "deltas": [base64.b64encode(r).decode("ascii") for r in replies],
        "checkpoint": cp.to_json(),
    }
    backend.close()
    return out


def main() -> None:
    path = HERE / "deltas" / f"{FORMAT.decode()}.json"
    if path.exists():
        raise SystemExit(f"{path} exists: fixtures are never edited")
    path.parent.mkdir(exist_ok=True)
    runs = {name: capture(make) for name, make in
            (("full", run_full), ("saved", run_saved), ("minimal", run_minimal))}  # fmt: skip
    assert runs["full"]["run_id"] == str(RUN)
    doc = {"format": FORMAT.decode(), "by": "tests/golden/make_deltas.py", "runs": runs}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
