"""`raygate dev up | down | env | build`: the local control plane from the command line."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from raygate.core.errors import RaygateError


def default_dir() -> Path:
    return Path(os.environ.get("RAYGATE_DEV_DIR", ".dev"))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser(
        "dev",
        help="run a local control plane (etcd, kube-apiserver, controller-manager, KubeRay) on loopback",
        description="A real Kubernetes control plane on 127.0.0.1, built from pinned Go modules.",
    )
    dev.add_argument("--dir", type=Path, default=default_dir(), help="state directory (default: .dev)")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="ACTION", required=True)

    up = dev_sub.add_parser("up", help="start the control plane (harmless when it already runs)")
    up.add_argument("--kuberay", action="store_true", help="also run the KubeRay operator")
    up.add_argument(
        "--raygate", action="store_true",
        help="also run raygate (webhook and reconciler) and opt in namespace demo; implies --kuberay --capacity",
    )
    up.add_argument("--capacity", action="store_true",
                    help="also run kube-scheduler, KWOK and cluster-autoscaler (kwok provider, ProvisioningRequests "
                         "on) with CPU nodes and a GPU node group that starts at zero")
    up.add_argument("--volcano", action="store_true",
                    help="also run the Volcano scheduler and controller-manager (queues, PodGroups); implies "
                         "--capacity (Volcano binds pods to its KWOK nodes)")
    up.add_argument("--gang-scheduling", action="store_true", default=None,
                    help="serve and run Kubernetes' own gang scheduling (Workload and PodGroup, scheduling.k8s.io/"
                         "v1alpha2): the feature gates GenericWorkload (kube-apiserver, with the API's runtime-config, "
                         "and kube-controller-manager) and GangScheduling (kube-scheduler), for raygate's native mode")
    up.add_argument("--gpu-nodes-max", type=int, default=None, metavar="N",
                    help="largest size of the GPU node group (default: 4 nodes of 4 GPUs)")
    up.add_argument("--fresh", action="store_true",
                    help="start from an empty cluster: stop what runs and delete the stored data first")
    up.add_argument(
        "--port", "--apiserver-port", dest="port", type=int, default=None,
        help="kube-apiserver port (default: a free one)",
    )
    up.set_defaults(func=_up)

    down = dev_sub.add_parser("down", help="stop every process `up` started")
    down.set_defaults(func=_down)

    env = dev_sub.add_parser("env", help="say what runs, and print the KUBECONFIG line to export")
    env.set_defaults(func=_env)

    build = dev_sub.add_parser("build", help="build the pinned binaries and collect the CRDs (make cluster-bins)")
    build.add_argument("--force", action="store_true", help="rebuild even when the cache is complete")
    build.set_defaults(func=_build)


def _control_plane(args: argparse.Namespace, *, build: bool = False):  # type: ignore[no-untyped-def]
    from raygate.devenv.build import Bundle, ensure_bundle
    from raygate.devenv.controlplane import ControlPlane
    from raygate.devenv.versions import bundle_dir

    bundle = ensure_bundle() if build else Bundle(bundle_dir())
    return ControlPlane(args.dir, bundle)


def _up(args: argparse.Namespace) -> int:
    cp = _control_plane(args, build=True)
    if args.fresh:
        cp.wipe()
    state = cp.up(kuberay=args.kuberay or args.raygate, apiserver_port=args.port, gang=args.gang_scheduling)
    if args.capacity or args.raygate or args.volcano or args.gpu_nodes_max is not None:
        from raygate.devenv.capacity import Layout, start_capacity

        layout = Layout() if args.gpu_nodes_max is None else Layout(gpu_nodes_max=args.gpu_nodes_max)
        print(f"dev: capacity: {start_capacity(cp, state, layout).describe()}")
    if args.volcano:
        from raygate.devenv.volcano import describe, start_volcano

        start_volcano(cp, state)
        print(f"dev: {describe()}")
    if args.raygate:
        from raygate.devenv.raygate_local import start_raygate

        start_raygate(cp)
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    _control_plane(args).down()
    return 0


def _env(args: argparse.Namespace) -> int:
    from raygate.devenv.capacity import layout_of
    from raygate.devenv.controlplane import alive, gang_scheduling

    cp = _control_plane(args)
    state = cp.load_state()
    if state is None:
        raise RaygateError(f"no control plane in {cp.workdir}: run `raygate dev up` first")
    print(f"# kube-apiserver https://127.0.0.1:{state.apiserver_port}")
    for name, pid in state.pids.items():
        print(f"# {name:<23} pid {pid:<8} {'running' if alive(pid) else f'EXITED: see {cp.logs / name}.log'}")
    if gang_scheduling(state):
        print("# gang scheduling: on (scheduling.k8s.io Workload and PodGroup; raygate's native mode)")
    layout = layout_of(state)
    if layout is not None:
        print(f"# capacity: {layout.describe()}")
    if "volcano" in state.extra:
        from raygate.devenv.volcano import describe

        print(f"# volcano: {describe()}")
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from raygate.devenv.build import ensure_bundle

    ensure_bundle(force=args.force)
    return 0
