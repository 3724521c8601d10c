"""kube-controller-manager's controller list: what a local stack starts with, and a running one that
lacks some (started by an older raygate, or without a controller asked for later) is restarted with
all of them, keeping what it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from raygate.devenv import controlplane
from raygate.devenv.build import Bundle
from raygate.devenv.controlplane import CONTROLLERS, ControlPlane, State


class Recorder(ControlPlane):
    """Records the processes it would start and stop instead of running them."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, Bundle(workdir / "bundle"))
        self.started: list[list[str]] = []
        self.stopped: list[str] = []

    def spawn(self, state: State, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.started.append(argv)
        state.pids[name] = 4242
        self.save_state(state)

    def stop_process(self, name: str, state: State | None = None) -> None:
        self.stopped.append(name)
        assert state is not None
        state.pids.pop(name)


def controllers(argv: list[str]) -> list[str]:
    flag = next(a for a in argv if a.startswith("--controllers="))
    return flag.removeprefix("--controllers=").split(",")


@pytest.fixture
def cp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    monkeypatch.setattr(controlplane, "alive", lambda pid: True)
    return Recorder(tmp_path / "dev")


def test_a_new_stack_runs_pod_gc_and_the_job_controller(cp: Recorder) -> None:
    cp.start_controller_manager(State(1, 2, 3))
    started = controllers(cp.started[-1])
    assert started == list(CONTROLLERS)
    assert {"pod-garbage-collector-controller", "job-controller"} <= set(started)


def test_a_running_one_with_every_controller_is_left_alone(cp: Recorder) -> None:
    state = State(1, 2, 3, pids={"kube-controller-manager": 99},
                  extra={"kcm-controllers": ",".join([*CONTROLLERS, "cronjob-controller"])})
    cp.start_controller_manager(state)
    cp.start_controller_manager(state, ("cronjob-controller",))
    assert cp.started == [] and cp.stopped == []


def test_a_running_one_without_pod_gc_is_restarted_with_it_keeping_its_extras(cp: Recorder) -> None:
    older = ["garbage-collector-controller", "namespace-controller", "serviceaccount-controller",
             "node-lifecycle-controller", "cronjob-controller"]
    state = State(1, 2, 3, pids={"kube-controller-manager": 99}, extra={"kcm-controllers": ",".join(older)})
    cp.start_controller_manager(state)
    assert cp.stopped == ["kube-controller-manager"]
    started = controllers(cp.started[-1])
    assert set(started) == {*CONTROLLERS, "cronjob-controller"} and len(started) == len(set(started))
    assert state.extra["kcm-controllers"] == ",".join(started)


def test_a_state_that_never_recorded_the_list_restarts_without_an_empty_name(cp: Recorder) -> None:
    state = State(1, 2, 3, pids={"kube-controller-manager": 99})
    cp.start_controller_manager(state)
    assert "" not in controllers(cp.started[-1])


def test_a_process_that_exits_is_reported_by_its_fatal_line_not_its_goroutine_dump(tmp_path: Path) -> None:
    log = tmp_path / "cluster-autoscaler.log"
    log.write_text("I1127 01:00:00.000 main.go:1] Cluster Autoscaler 1.33\n"
                   "F1127 01:00:01.000 kwok_provider.go:214] failed to load kwok provider config: timeout\n"
                   "goroutine 1 [running]:\nmain.main()\n\t/src/main.go:1 +0x1\n")
    assert controlplane.log_gist(log).endswith("failed to load kwok provider config: timeout")
    log.write_text("I1127 01:00:00.000 main.go:1] starting\nI1127 01:00:01.000 main.go:2] still starting\n")
    assert controlplane.log_gist(log).endswith("still starting")
    assert controlplane.log_gist(tmp_path / "absent.log") == "no log"


def test_ports_for_listeners_come_from_below_the_range_outgoing_connections_draw_from() -> None:
    ephemeral_from = int(controlplane.EPHEMERAL_RANGE.read_text().split()[0])
    ports = {controlplane.free_port() for _ in range(50)}
    assert all(controlplane.LISTEN_PORTS_FROM <= p < ephemeral_from for p in ports), sorted(ports)
    assert len(ports) > 1  # picked at random, so two stacks starting at once do not race for one port
