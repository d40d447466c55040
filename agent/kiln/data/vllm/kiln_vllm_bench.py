"""vLLM's benchmark client (`vllm bench serve`), reading every server-sent event of a stream.

vLLM's client strips each network read before it splits the stream into events, and takes an event's payload
after "data: " with its space. When a read ends right after "data:", the next read's leading space is stripped
away, the payload is not found, and the request is counted as failed ("Expecting value: line 1 column 1"),
though the server's stream was valid (the space after "data:" is optional in server-sent events). Behind a
proxy the reads split anywhere, so a loaded run loses a request now and then. SpacedEvents puts the space back
before vLLM's own handler reads the buffer.

Run: python kiln_vllm_bench.py [vllm bench serve flags]
"""

import re
import sys

from vllm.benchmarks.lib import endpoint_request_func
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

_DATA_FIELD = re.compile(r"(^|\n\n)data:(?=\S)")


class SpacedEvents(endpoint_request_func.StreamedResponseHandler):
    def add_chunk(self, chunk_bytes: bytes) -> list[str]:
        self.buffer = _DATA_FIELD.sub(r"\1data: ", self.buffer + self._decoder.decode(chunk_bytes))
        messages: list[str] = super().add_chunk(b"")
        return messages


if __name__ == "__main__":
    # Each request function looks the handler up by name at every call.
    endpoint_request_func.StreamedResponseHandler = SpacedEvents  # type: ignore[misc]
    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
