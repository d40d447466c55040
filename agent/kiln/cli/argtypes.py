"""Command-line values checked where argparse reads them: a bad one is a usage error naming the flag."""

from __future__ import annotations

import argparse
import math


def positive_number(text: str) -> float:
    """A finite number above 0 (a time budget, a price): not `nan`, `inf` or `-5`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_count(text: str) -> int:
    """A whole number of at least 1 (streams, prompts, tokens, instances)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value
