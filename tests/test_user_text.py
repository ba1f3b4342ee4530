"""The caller's data is never read as a script option (issue 26 §5).

The writing scripts take two options besides their data: the fence of a fenced write and the
backend's retention options. They used to travel as optional trailing arguments recognised by
a prefix (``@fence ...``, ``@retention ...``), so an event whose last stored field was user
text starting with ``@`` (a log line "@alice please look", an ``acp_raw`` kind, an
``acp_request`` method) was refused as a malformed option, and a batch holding it was lost
whole. The options now sit in two slots at fixed positions, always sent: any text is data.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from luft_redis import AgentTask, Log, LogLevel
from luft_redis import types as t

TEXTS = ["@alice please look at this", "@retention 1 2", "@fence x 1 y", "@", "@@", "@retention"]


def _events(run_id: uuid.UUID, agent: uuid.UUID, text: str) -> list[t.AgentEvent]:
    """Every event kind whose last stored field can be free text, carrying ``text``."""
    return [
        Log(run_id=run_id, agent_id=agent, level=LogLevel.INFO, msg=text),
        t.AcpRaw(run_id=run_id, agent_id=agent, kind=text),
        t.AcpRequest(run_id=run_id, agent_id=agent, method=text),
    ]


@pytest.mark.parametrize(
    "options",
    [{}, {"max_events": 10_000, "expire_finished_after": dt.timedelta(hours=1)}],
    ids=["no-options", "retention"],
)
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
def test_text_starting_with_at_is_stored_as_data(
    make_frontend_backend: Callable[..., Any], options: dict[str, Any], fenced: bool
) -> None:
    backend = make_frontend_backend(watch=False, **options)
    run_id, agent = uuid.uuid4(), uuid.uuid4()
    backend.init_run(run_id, "user text", "/d")
    lease = None
    if fenced:
        backend.submit_agents([AgentTask(agent, 0, None)])
        lease = backend.claim_agent("w", lease_for=60.0)
        assert lease is not None
    written: list[t.AgentEvent] = []
    for text in TEXTS:
        for event in _events(run_id, agent, text):  # alone: the event is the last argument
            backend.append_event(event, lease=lease)
            written.append(event)
        batch = [Log(run_id=run_id, agent_id=agent, level=LogLevel.INFO, msg=f"line {i}")
                 for i in range(20)]  # fmt: skip
        batch.append(Log(run_id=run_id, agent_id=agent, level=LogLevel.WARN, msg=text))
        backend.append_events(batch, lease=lease)  # a batch of 21, the text last
        written += batch
    assert backend.get_event_log() == written
