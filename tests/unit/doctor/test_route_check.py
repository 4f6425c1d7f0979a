"""`python -m paddle_dist.doctor --check` makes the route and interface check a multi-node
job makes before it starts (netcheck.check through preflight.refusals)."""

from paddle_dist.doctor import facts
from paddle_dist.runtime import netcheck
from paddle_dist.config import load
from paddle_dist.launch.preflight import ERROR, refusals
from paddle_dist.runtime.devices import GpuInfo


# ---------------------------------------------------------------- doctor --check's route check
def _no_route(master, ifname):
    raise netcheck.NetworkError(f"no route from this machine to master {master.split(':')[0]} "
                                "(198.19.5.5): [Errno 101] Network is unreachable; check dist.master")


def test_the_route_is_checked_for_a_multi_node_master_only():
    def route_problems(cfg, route):
        return refusals(cfg, {}, GpuInfo(), route)

    cfg = load(overrides=["dist.master=198.19.5.5:6170", "dist.nnodes=2"])
    [problem] = route_problems(cfg, _no_route)
    assert problem.severity == ERROR and "no route from this machine" in problem.message
    assert route_problems(load(overrides=["dist.master=198.19.5.5:6170"]), _no_route) == []
    assert route_problems(cfg, lambda master, ifname: "eth0") == []


def test_doctor_check_reports_a_master_without_route(monkeypatch, capsys):
    def route_to(host):
        raise netcheck.NetworkError(f"no route from this machine to master {host}: unreachable; "
                                    "check dist.master and this node's network configuration")
    monkeypatch.setattr(netcheck, "route_to", route_to)
    assert facts.main(["--check", "-o", "dist.master=198.19.5.5:6170", "-o", "dist.nnodes=2"]) == 1
    out = capsys.readouterr().out
    assert "error: no route from this machine to master 198.19.5.5" in out
    assert "pre-flight: ok" not in out
