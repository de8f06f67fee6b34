"""Multi-node runs across two hosts made on this machine (network namespaces joined by a veth pair, see
netns_hosts.py), started the two ways docs/guides/multi-node.md gives: `multinode_torchrun.sh` on each host (static
rendezvous at node 0) and `multinode_colossalai.sh` (`colossalai run --hostfile` over SSH). Gloo runs over the
veth link; the checkpoints and logs sit on the filesystem both hosts share, as NFS would be."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from coati.utils.ckpt_io import latest_checkpoint
from conftest import REPO, SCRIPTS, TORCHRUN_ENV, checkpoint_names, torchrun
from netns_hosts import IFNAME, SSHD, TwoHosts, unavailable_reason, workers_of

pytestmark = pytest.mark.slow
REASON = unavailable_reason()
if REASON:
    pytest.skip(f"cannot build two hosts on this machine: {REASON}", allow_module_level=True)

BATCH = 8   # 96 rows over 2 ranks in micro-batches of 8: 6 steps an epoch
DIST_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    two = TwoHosts(tmp_path_factory.mktemp("hosts")).up()
    yield two
    two.down()


def _sft_args(assets, out: Path, batch: int = BATCH, epochs: int = 2, *extra: str) -> List[str]:
    return ["--pretrain", str(assets["model"]), "--dataset", str(assets["sft_train"]), "--plugin", "ddp",
            "--batch_size", str(batch), "--max_epochs", str(epochs), "--lr", "1e-3", "--log_interval", "1",
            "--save_interval", "4", "--save_dir", str(out / "ckpt"), "--log_dir", str(out / "logs"), *extra]


def _env(hosts: TwoHosts, **extra: str) -> Dict[str, str]:
    """What a user's shell on each node holds: the venv on PATH and the interface gloo must use."""
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "GLOO_SOCKET_IFNAME": IFNAME,
            "HF_HUB_OFFLINE": "1", **TORCHRUN_ENV, **extra}


def _start_torchrun_nodes(hosts: TwoHosts, args: List[str], logs: Path, **env: str) -> List[subprocess.Popen]:
    """`multinode_torchrun.sh train_sft.py ARGS` on each host, node 0 hosting the rendezvous."""
    logs.mkdir(parents=True, exist_ok=True)
    return [hosts.popen(node, ["bash", str(SCRIPTS / "multinode_torchrun.sh"), "train_sft.py", *args],
                        _env(hosts, NNODES="2", NODE_RANK=str(node), NPROC_PER_NODE="1",
                             RDZV_ENDPOINT=f"{hosts.addresses[0]}:29400", **env),
                        logs / f"node{node}.log", REPO)
            for node in range(2)]


def _wait_all(procs: List[subprocess.Popen], timeout: float) -> List[Optional[int]]:
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
    return [proc.poll() for proc in procs]


def _records(out: Path) -> List[Dict[str, float]]:
    """Logged training metrics without wall-clock times."""
    lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]


def _assert_same_metrics(actual: List[Dict[str, float]], expected: List[Dict[str, float]], rel: float) -> None:
    assert [r["step"] for r in actual] == [r["step"] for r in expected]
    for got, want in zip(actual, expected):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=rel, abs=1e-9), (got["step"], key)


def _logs(path: Path) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in sorted(path.glob("*.log")))


@pytest.fixture(scope="module")
def one_node_run(tiny_assets, tmp_path_factory):
    """The reference: the same config as 1 node x 2 processes."""
    out = tmp_path_factory.mktemp("one_node")
    result = torchrun(SCRIPTS / "train_sft.py", 2, *_sft_args(tiny_assets, out))
    assert result.returncode == 0, result.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def two_node_run(hosts, tiny_assets, tmp_path_factory):
    """2 nodes x 1 process with torchrun's rendezvous, and what crossed the veth link meanwhile."""
    out = tmp_path_factory.mktemp("two_nodes")
    before = hosts.link_stats(0)
    procs = _start_torchrun_nodes(hosts, _sft_args(tiny_assets, out), out / "launch")
    assert _wait_all(procs, 300) == [0, 0], _logs(out / "launch")
    after = hosts.link_stats(0)
    return out, {key: after[key] - before[key] for key in after}


def test_torchrun_rendezvous_across_two_hosts_matches_one_node(hosts, two_node_run, one_node_run, tiny_assets):
    out, traffic = two_node_run
    assert checkpoint_names(out / "ckpt") == ["epoch-0_step-4", "epoch-1_step-8",
                                                                 "epoch-2_step-12"]
    last = out / "ckpt" / "epoch-2_step-12"
    assert (last / "COMPLETE").is_file() and (last / "rng_state_rank0.pt").is_file()
    assert (last / "rng_state_rank1.pt").is_file()
    assert json.loads((last / "running_states.json").read_text())["world_size"] == 2
    _assert_same_metrics(_records(out), _records(one_node_run), rel=1e-6)

    # The gradients went over the veth link: each step all-reduces every weight (fp32) between the hosts,
    # and the hosts know no route but their own /24, so nothing else could have carried them.
    weight_bytes = sum(f.stat().st_size for f in Path(tiny_assets["model"]).glob("*.safetensors"))
    assert traffic["tx_bytes"] > 12 * weight_bytes / 2 and traffic["rx_bytes"] > 12 * weight_bytes / 2
    assert hosts.routes(0) == ["198.18.0.0/24"] and hosts.routes(1) == ["198.18.0.0/24"]


@pytest.mark.skipif(not os.path.exists(SSHD), reason="openssh-server is not installed (`make test` installs it as root)")
def test_colossalai_run_hostfile_over_ssh_matches_one_node(hosts, one_node_run, tiny_assets, tmp_path):
    home = hosts.start_ssh()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("\n".join(hosts.addresses) + "\n")
    out = tmp_path / "run"
    result = subprocess.run(
        hosts.command(0, ["bash", str(SCRIPTS / "multinode_colossalai.sh"), "train_sft.py",
                          *_sft_args(tiny_assets, out)]),
        env=_env(hosts, HOME=str(home), HOSTFILE=str(hostfile), NPROC_PER_NODE="1"),
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"{hosts.addresses[0]}: success" in result.stdout and f"{hosts.addresses[1]}: success" in result.stdout
    for node in range(2):   # both nodes were started over SSH, the launcher's own host included
        assert "Accepted publickey for root" in (hosts.workdir / "ssh" / f"sshd_{node}.log").read_text()
    assert (out / "ckpt" / "epoch-2_step-12" / "COMPLETE").is_file()
    _assert_same_metrics(_records(out), _records(one_node_run), rel=1e-6)


def _start_long_run(hosts: TwoHosts, assets, out: Path) -> List[subprocess.Popen]:
    procs = _start_torchrun_nodes(hosts, _sft_args(assets, out, BATCH, 400, "--keep_last", "2", "--dist_timeout",
                                                   str(DIST_TIMEOUT_S)), out / "launch")
    deadline = time.monotonic() + 180
    while latest_checkpoint(out / "ckpt") is None and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), _logs(out / "launch")
        time.sleep(0.05)
    assert latest_checkpoint(out / "ckpt") is not None, _logs(out / "launch")
    return procs


def _assert_resumes_on_one_node(assets, out: Path) -> None:
    """The newest complete checkpoint loads on one node (2 processes) and training goes on from it."""
    checkpoint = latest_checkpoint(out / "ckpt")
    step = json.loads((checkpoint / "running_states.json").read_text())["step"]
    result = torchrun(SCRIPTS / "train_sft.py", 2, *_sft_args(assets, out / "resumed", BATCH, 400),
                      "--checkpoint_path", str(checkpoint), "--max_steps", str(step + 3))
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"resumed from {checkpoint}" in result.stdout + result.stderr
    assert [r["step"] for r in _records(out / "resumed")] == [step + 1, step + 2, step + 3]


@pytest.mark.extended
def test_a_killed_node_stops_every_rank_and_the_checkpoint_resumes(hosts, tiny_assets, tmp_path):
    out = tmp_path / "run"
    procs = _start_long_run(hosts, tiny_assets, out)
    workers = workers_of(procs[1], "train_sft.py")
    assert len(workers) == 1
    workers[0].kill()
    killed = time.monotonic()
    codes = _wait_all(procs, 60)
    assert all(code not in (None, 0) for code in codes), _logs(out / "launch")
    assert time.monotonic() - killed < 60
    node0 = (out / "launch" / "node0.log").read_text()
    assert "lost contact with the other ranks" in node0 and "--checkpoint_path latest" in node0
    _assert_resumes_on_one_node(tiny_assets, out)


@pytest.mark.extended
def test_an_unreachable_node_times_out_instead_of_hanging(hosts, tiny_assets, tmp_path):
    out = tmp_path / "run"
    procs = _start_long_run(hosts, tiny_assets, out)
    hosts.set_link(1, up=False)
    try:
        cut = time.monotonic()
        codes = _wait_all(procs, DIST_TIMEOUT_S + 30)
        took = time.monotonic() - cut
    finally:
        hosts.set_link(1, up=True)
    assert all(code not in (None, 0) for code in codes), _logs(out / "launch")
    assert took > DIST_TIMEOUT_S * 0.8   # the ranks waited for the collective timeout, no longer than bounded
    for node in range(2):
        log = (out / "launch" / f"node{node}.log").read_text()
        assert "lost contact with the other ranks" in log and f"Timed out waiting {DIST_TIMEOUT_S * 1000}ms" in log
    _assert_resumes_on_one_node(tiny_assets, out)


@pytest.mark.extended
def test_ddp_checkpoints_reshard_between_two_nodes_and_one_process(hosts, two_node_run, tiny_assets, tmp_path):
    """2 nodes x batch 8 and 1 process x batch 16 take the same global batches: a checkpoint of one resumed
    on the other logs what the uninterrupted run logged."""
    two_nodes, _ = two_node_run
    single = tmp_path / "single"
    single.mkdir()
    (single / "ckpt").mkdir()
    subprocess.run(["cp", "-r", str(two_nodes / "ckpt" / "epoch-0_step-4"), str(single / "ckpt")], check=True)
    result = torchrun(SCRIPTS / "train_sft.py", 1, *_sft_args(tiny_assets, single, 2 * BATCH), "--checkpoint_path",
                      "latest")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "written by 2 ranks" in result.stdout + result.stderr
    _assert_same_metrics(_records(single), _records(two_nodes)[4:], rel=1e-4)

    full = tmp_path / "full"
    result = torchrun(SCRIPTS / "train_sft.py", 1, *_sft_args(tiny_assets, full, 2 * BATCH))
    assert result.returncode == 0, result.stderr[-4000:]
    spread = tmp_path / "spread"
    (spread / "ckpt").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(full / "ckpt" / "epoch-1_step-8"), str(spread / "ckpt")], check=True)
    procs = _start_torchrun_nodes(hosts, [*_sft_args(tiny_assets, spread), "--checkpoint_path", "latest"],
                                  spread / "launch")
    assert _wait_all(procs, 300) == [0, 0], _logs(spread / "launch")
    _assert_same_metrics(_records(spread), _records(full)[8:], rel=1e-4)
