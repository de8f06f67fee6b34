"""How a script fails: usage errors, lost peers, a full disk and Ctrl-C become one line and their own exit status."""
import errno

import pytest
import torch.distributed as dist

from coati.utils import errors
from coati.utils.errors import PEER_LOST_EXIT_CODE, USAGE_EXIT_CODE, CoatiUsageError, exit_cleanly

GLOO_RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:525] Read error [198.18.0.2]:40093: Connection reset by peer"
GLOO_TIMEOUT = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation"


def _failing(error: BaseException):
    @exit_cleanly
    def main():
        raise error

    return main


def test_usage_error_prints_one_line_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exited:
        _failing(CoatiUsageError("--pretrain x does not exist"))()
    assert exited.value.code == USAGE_EXIT_CODE
    assert capsys.readouterr().err == "error: --pretrain x does not exist\n"


@pytest.mark.parametrize("error", [RuntimeError(GLOO_RESET), RuntimeError(GLOO_TIMEOUT),
                                   dist.DistBackendError("NCCL watchdog: collective timed out")])
def test_a_lost_peer_prints_what_happened_and_exits_3(capsys, error):
    with pytest.raises(SystemExit) as exited:
        _failing(error)()
    assert exited.value.code == PEER_LOST_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("error: rank 0 lost contact with the other ranks (") and str(error) in err
    assert "--checkpoint_path latest" in err and err.count("\n") == 1


def test_other_errors_keep_their_traceback():
    with pytest.raises(RuntimeError, match="shape mismatch"):
        _failing(RuntimeError("shape mismatch"))()


@pytest.fixture(autouse=True)
def no_run_known():
    """Each test starts as a process that knows no run (a run an earlier test started in this process is forgotten)."""
    errors._RUN.clear()
    yield
    errors._RUN.clear()


def test_ctrl_c_is_one_line_and_exit_130_saying_how_the_run_goes_on(capsys, tmp_path):
    def interrupted() -> str:
        with pytest.raises(SystemExit) as exited:
            _failing(KeyboardInterrupt())()
        assert exited.value.code == 130
        return capsys.readouterr().err

    assert interrupted() == ("error: interrupted; the complete checkpoints in --save_dir, if any, are kept (resume "
                             "with --checkpoint_path latest)\n")   # a process that knows no run: the launcher
    errors.remember_save_dir(None)
    assert interrupted() == "error: interrupted; this run keeps no checkpoint (no --save_dir): run it again from the " \
                            "start\n"
    errors.remember_save_dir(str(tmp_path))
    (tmp_path / "epoch-0_step-8").mkdir()   # being written when the run stopped: no COMPLETE marker
    assert interrupted() == f"error: interrupted; no complete checkpoint in {tmp_path} yet: run it again from the " \
                            "start\n"
    (tmp_path / "epoch-0_step-4").mkdir()
    (tmp_path / "epoch-0_step-4" / "COMPLETE").write_text("{}")
    assert interrupted() == (f"error: interrupted; complete checkpoints in {tmp_path} are kept (resume from "
                             "epoch-0_step-4 with --checkpoint_path latest)\n")


def test_a_full_disk_is_one_line_naming_the_file(capsys):
    with pytest.raises(SystemExit) as exited:
        _failing(OSError(errno.ENOSPC, "No space left on device", "/ckpt/epoch-0_step-4/optimizer.bin"))()
    assert exited.value.code == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("error: no space left on the device while writing /ckpt/epoch-0_step-4/optimizer.bin;")
    assert err.count("\n") == 1


def test_other_os_errors_keep_their_traceback():
    with pytest.raises(PermissionError):
        _failing(PermissionError(errno.EACCES, "Permission denied", "/x"))()

