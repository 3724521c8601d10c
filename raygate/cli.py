"""The `raygate` command (also installed as `kubectl-raygate`).

Each component registers its own subcommand; heavy imports happen inside the handlers so that
`raygate --help` stays fast and a broken optional piece cannot break unrelated subcommands.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from collections.abc import Callable, Sequence

from raygate.core.api import Served
from raygate.core.errors import RaygateError

_Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrars() -> list[_Registrar]:
    from raygate import explain, release, serve, status
    from raygate.certs import cli as certs_cli
    from raygate.reconciler import cli as reconciler_cli
    from raygate.webhook import cli as webhook_cli

    return [
        webhook_cli.register,
        # The commands wire the components together: the reconciler renews the webhook certificate
        # with the certs component's loop without importing it.
        functools.partial(reconciler_cli.register, renew_certificates=certs_cli.renew_forever),
        functools.partial(serve.register, renew_certificates=certs_cli.renew_forever),
        certs_cli.register,
        # `explain --kubeconfig` asks a cluster what it serves; explain itself stays a pure decision.
        functools.partial(explain.register, discover=_served_at),
        status.register,
        release.register,
        *_workshop(),
    ]


def _workshop() -> list[_Registrar]:
    """`raygate dev` and `raygate demo`, where the workshop is: a checkout has raygate/devenv, the wheel (and so the
    image) leaves it out."""
    if importlib.util.find_spec("raygate.devenv") is None:
        return []
    from raygate.devenv import cli as dev_cli
    from raygate.devenv import demo

    return [dev_cli.register, demo.register]


def _served_at(kubeconfig: str) -> Served:
    from raygate.kube import discovery

    return discovery.served_at(kubeconfig)


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
