"""`raygate explain`: placeholder until the webhook lands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("explain", help="run the admission decision offline on a manifest")
