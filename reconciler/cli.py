"""`raygate reconciler`: placeholder until the reconciler lands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("reconciler", help="run the reconciler")
