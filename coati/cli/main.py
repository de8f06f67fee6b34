"""The `coati` command: `coati <command> [--config FILE] [flags] [--nproc_per_node N ...]`.

With launch flags (`--nproc_per_node`, `--nnodes`, `--node_rank`, `--master_addr`, `--master_port`; or `--hostfile`
for `colossalai run`), or `num_processes`/`nproc_per_node` in the config file, it starts the distributed run itself
and each process runs the command in place; without them, or already under a launcher, it runs in this process.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, NoReturn, Optional, Tuple

from coati.cli.config_file import LAUNCH_KEYS, nearest, read_config, split_config_flag
from coati.cli.openrlhf_names import openrlhf_launch
from coati.cli.verl_names import verl_launch
from coati.utils.errors import USAGE_EXIT_CODE, CoatiUsageError, fail, note_user
from coati.utils.lifetime import ends_with_parent

LAUNCH_FLAGS = ("--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port", "--hostfile")
LAUNCHER_ENV = ("LOCAL_RANK", "TORCHELASTIC_RUN_ID")
"""Set in a process that torchrun (or colossalai run, which calls it) started: the command then runs in place."""


def _commands() -> Dict[str, object]:
    from coati.cli.commands import COMMANDS

    return COMMANDS


def usage() -> str:
    lines = ["usage: coati <command> [--config FILE] [flags] [--nproc_per_node N]", "", "commands:"]
    for name, command in _commands().items():
        lines.append(f"  {name:<10} {(command.__doc__ or '').strip().splitlines()[0]}")
    lines += ["", "`coati <command> --help` lists a command's flags; a config file's keys are the same flags without "
                  "their dashes (TRL's and ColossalChat's names too; verl's section.key=value overrides and OpenRLHF's "
                  "--section.name flags for the commands of their scripts).",
              "Launch: --nproc_per_node N (one node, torchrun), --nnodes --node_rank --master_addr --master_port "
              "(torchrun's rendezvous), or --hostfile FILE (colossalai run)."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    """Run `coati <command>`: here, or under the launcher its launch flags ask for."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        try:
            print(usage(), flush=True)
        except BrokenPipeError:   # `coati --help | head`: the reader has what it wanted
            sys.stdout = open(os.devnull, "w")
        sys.exit(0 if argv else USAGE_EXIT_CODE)
    name, rest = argv[0], argv[1:]
    commands = _commands()
    if name not in commands:
        _refuse(f"unknown command {name!r}{nearest(name, commands)}; the commands are {', '.join(commands)}")
    try:
        launch, rest = launch_options(rest, name)
    except CoatiUsageError as error:
        _refuse(str(error))
    if launch and not any(os.environ.get(v) for v in LAUNCHER_ENV):
        _check_before_launch(name, rest, launch)
        if rendezvous_note(launch):
            note_user(rendezvous_note(launch))
        sys.exit(run_launcher(launcher_command(name, launch, rest), launch_environment(launch, os.environ)))
    sys.argv[0] = f"coati {name}"   # the command's --help and errors name it
    commands[name](rest)


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What this process passes on to the launcher's processes: a Ctrl-C, a scheduler's or `kill`'s SIGTERM, a closed
terminal's SIGHUP."""


def run_launcher(command: List[str], env: Dict[str, str]) -> int:
    """Run the launcher and return its exit status. It runs in a session of its own, and this process passes it every
    signal of `FORWARDED_SIGNALS` it gets, which torchrun passes on to the training processes: signalling this
    process alone (a Ctrl-C, `kill PID`, a scheduler's SIGTERM) stops the run with the line saying how to resume,
    and no process is left behind; killed outright, this process takes the launcher with it (SIGTERM on its death)."""
    started: List[subprocess.Popen] = []

    def forward(signum: int, _frame: object) -> None:
        if not started:   # before the launcher exists: it will not start
            sys.exit(128 + signum)
        try:
            os.killpg(started[0].pid, signum)
        except ProcessLookupError:   # the launcher has ended already
            pass

    for number in FORWARDED_SIGNALS:
        signal.signal(number, forward)
    started.append(subprocess.Popen(command, env=env, start_new_session=True,
                                    preexec_fn=ends_with_parent(signal.SIGTERM)))
    return started[0].wait()


def _check_before_launch(name: str, argv: List[str], launch: Dict[str, str]) -> None:
    """A training command's flags parsed, its paths checked and its memory estimated here, once, for the processes
    `launch` starts, before any of them starts."""
    from coati.cli.commands import TRAINING, check_flags

    if name in TRAINING:
        sys.argv[0] = f"coati {name}"
        check_flags(name, argv, launched_processes(launch))


TORCHRUN_MASTER = ("127.0.0.1", "29500")
"""torchrun's --master_addr and --master_port where they are not given."""


def rendezvous_note(launch: Dict[str, str]) -> Optional[str]:
    """Where torchrun joins several nodes, that this node now waits for the others and where (torchrun prints
    nothing until every node has joined); None for one node or a hostfile's launch."""
    nodes = int(launch.get("--nnodes", "1"))
    if nodes == 1 or "--hostfile" in launch:
        return None
    address = f"{launch.get('--master_addr', TORCHRUN_MASTER[0])}:{launch.get('--master_port', TORCHRUN_MASTER[1])}"
    return (f"node {launch.get('--node_rank', '0')} of {nodes}: waiting for every node to join at {address} (each "
            "node runs this command with its own --node_rank, and --master_addr naming node 0)")


def launched_processes(launch: Dict[str, str]) -> Tuple[int, int]:
    """(world size, processes on each node) of `launch`: `--nproc_per_node` times `--nnodes` (torchrun) or the
    hostfile's hosts (colossalai run)."""
    nproc = int(launch.get("--nproc_per_node", "1"))
    if "--hostfile" in launch:
        lines = Path(launch["--hostfile"]).read_text().splitlines()
        nodes = sum(1 for line in lines if line.strip() and not line.lstrip().startswith("#"))
    else:
        nodes = int(launch.get("--nnodes", "1"))
    return nproc * max(nodes, 1), nproc


def _refuse(message: str) -> NoReturn:
    fail(f"error: {message} (see coati --help)", USAGE_EXIT_CODE)


def launch_options(argv: List[str], command: str = "") -> Tuple[Dict[str, str], List[str]]:
    """The launch flags in `argv` (and launch keys of its `--config` file, and verl's `trainer.n_gpus_per_node` and
    `trainer.nnodes` there or as overrides, which the flags override), and the other arguments."""
    launch: Dict[str, str] = {}
    path, _ = split_config_flag(argv)
    values = read_config(path) if path else {}
    for key, value in values.items():
        if key in LAUNCH_KEYS:
            launch[LAUNCH_KEYS[key]] = str(value)
    launch.update(verl_launch(command, values, argv))
    launch.update(openrlhf_launch(command, argv))
    rest, i = [], 0
    while i < len(argv):
        flag, sep, value = argv[i].partition("=")
        if flag in LAUNCH_FLAGS:
            if not sep:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise CoatiUsageError(f"{flag} needs a value")
                value, i = argv[i + 1], i + 1
            launch[flag] = value
        else:
            rest.append(argv[i])
        i += 1
    _check_launch(launch)
    return launch, rest


def _check_launch(launch: Dict[str, str]) -> None:
    for flag in ("--nproc_per_node", "--nnodes", "--node_rank", "--master_port"):
        if flag in launch and not (launch[flag].isdigit() and (int(launch[flag]) >= 1 or flag == "--node_rank")):
            raise CoatiUsageError(f"{flag} {launch[flag]}: expected a whole number" +
                                  (" >= 1" if flag != "--node_rank" else " >= 0"))
    if "--hostfile" in launch:
        if not Path(launch["--hostfile"]).is_file():
            raise CoatiUsageError(f"--hostfile {launch['--hostfile']} does not exist or is not a file")
        torchrun_only = sorted(set(launch) & {"--nnodes", "--node_rank"})
        if torchrun_only:
            raise CoatiUsageError(f"--hostfile (colossalai run) and {', '.join(torchrun_only)} (torchrun's rendezvous): "
                                  "give one way of launching")


def launch_environment(launch: Dict[str, str], environ: Mapping[str, str]) -> Dict[str, str]:
    """The launcher's environment: torchrun's one OpenMP thread per process where a node starts more than one and
    OMP_NUM_THREADS is unset, set here so that torchrun does not print its note about it at every launch."""
    env = dict(environ)
    if int(launch.get("--nproc_per_node", "1")) > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launcher_command(name: str, launch: Dict[str, str], rest: List[str]) -> List[str]:
    """torchrun (or `colossalai run` with a hostfile) starting `coati <name> rest` on every process."""
    nproc = launch.get("--nproc_per_node", "1")
    if "--hostfile" in launch:
        options = ["--hostfile", launch["--hostfile"], "--nproc_per_node", nproc]
        for flag in ("--master_addr", "--master_port"):
            if flag in launch:
                options += [flag, launch[flag]]
        return ["colossalai", "run", *options, str(Path(__file__).resolve()), name, *rest]
    options = [f"--nproc_per_node={nproc}"]
    if int(launch.get("--nnodes", "1")) == 1 and "--master_addr" not in launch:
        options.append("--standalone")
    else:
        options += [f"{flag}={launch[flag]}" for flag in ("--nnodes", "--node_rank", "--master_addr", "--master_port")
                    if flag in launch]
    return [sys.executable, "-m", "coati.cli.torchrun", *options, "--module", "coati.cli.main", name, *rest]


if __name__ == "__main__":
    main()
