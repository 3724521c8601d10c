"""The `raygate` command (also installed as `kubectl-raygate`).

Each component registers its own subcommand; heavy imports happen inside the handlers so that
`raygate --help` stays fast and a broken optional piece cannot break unrelated subcommands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from raygate.errors import RaygateError

_Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrars() -> list[_Registrar]:
    from certs import cli as certs_cli
    from raygate import demo, explain, release, status
    from raygate.devenv import cli as dev_cli
    from reconciler import cli as reconciler_cli
    from webhook import cli as webhook_cli

    return [
        webhook_cli.register,
        reconciler_cli.register,
        certs_cli.register,
        explain.register,
        status.register,
        release.register,
        dev_cli.register,
        demo.register,
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raygate",
        description="Gang admission for Ray on Kubernetes: RayJobs and RayClusters get every pod or none.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _registrars():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.func
    try:
        return handler(args)
    except RaygateError as err:
        print(f"raygate: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
