"""kiln bench's launcher of vLLM's benchmark client reads every event of a valid stream, however the network
splits it: read loop and handler as vLLM's OpenAI request functions run them."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

from tests.conftest import load_script

from kiln.bench.client import BENCH_LAUNCHER

STREAM = b'data: {"text": "a b"}\n\ndata: {"text": " c"}\n\ndata: {"usage": 3}\n\ndata: [DONE]\n\n'
EVENTS = [{"text": "a b"}, {"text": " c"}, {"usage": 3}]


def launcher() -> ModuleType:
    return load_script("kiln_vllm_bench", BENCH_LAUNCHER)


def read(handler: Any, reads: list[bytes]) -> list[dict[str, Any]] | str:
    """The events, or the error vLLM's request function would record."""
    events = []
    try:
        for raw in reads:
            stripped = raw.strip()  # as vLLM's client does, to every read
            if not stripped:
                continue
            for message in handler.add_chunk(stripped):
                if not message.startswith(":") and (chunk := message.removeprefix("data: ")) != "[DONE]":
                    events.append(json.loads(chunk))
    except json.JSONDecodeError as exc:
        return str(exc)
    return events


def test_every_event_is_read_wherever_the_stream_is_split() -> None:
    spaced = launcher().SpacedEvents
    splits = [[STREAM[:i], STREAM[i:]] for i in range(1, len(STREAM))]
    for reads in [*splits, [STREAM[i:i + 1] for i in range(len(STREAM))]]:  # ... and a byte at a time
        events = read(spaced(), reads)
        # vLLM's strip() of every read also drops a space inside a string at a read's edge: the text may change,
        # never the events (the output tokens come from the usage event).
        assert isinstance(events, list) and [sorted(e) for e in events] == [["text"], ["text"], ["usage"]], reads
    assert read(spaced(), [STREAM]) == EVENTS
    # vLLM's own handler fails a request when a read ends right after "data:".
    lost = [reads for reads in splits if read(vllm_handler(), reads) == "Expecting value: line 1 column 1 "
            "(char 0)"]
    assert [b'data: {"text": "a b"}\n\ndata:', b' {"text": " c"}\n\ndata: {"usage": 3}\n\ndata: [DONE]\n\n'] in lost


def test_an_event_without_the_optional_space_is_read() -> None:
    stream = [b'data:{"text": "a"}\n\ndata:{"usage": 1}\n\ndata:[DONE]\n\n']
    assert read(launcher().SpacedEvents(), stream) == [{"text": "a"}, {"usage": 1}]
    assert read(vllm_handler(), stream) == "Expecting value: line 1 column 1 (char 0)"


def vllm_handler() -> object:
    """vLLM's own stream handler, imported when a test needs it (importing vLLM takes seconds)."""
    from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler  # noqa: PLC0415

    return StreamedResponseHandler()
