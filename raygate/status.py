"""`raygate status`: placeholder until the webhook lands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("status", help="list held and failed jobs")
