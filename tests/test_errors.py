"""How a script fails: usage errors and lost peers become one line and their own exit status."""
import pytest
import torch.distributed as dist

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
