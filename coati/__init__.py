"""coati: aligning language models with human feedback and verifiable rewards on ColossalAI."""
import logging
import warnings

__version__ = "0.1.0"

_IMPORT_NAGS = (r"Please install apex from source", r"Please install the latest tensornvme")
"""colossalai's import-time notes about optional CUDA extensions (apex, tensornvme) that coati never uses."""


class _DropMessage(logging.Filter):
    """Drops log records whose message starts with `prefix`."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def _quiet_third_party_imports() -> None:
    """A training script starts without a wall of third-party notes about kernels it does not use: colossalai's
    apex/tensornvme warnings, its checkpoint IO's torch.load notes on resume (the files are the checkpoints coati wrote
    and verified), and bitsandbytes' 4-bit CPU kernel note (bitsandbytes comes with colossalai; coati never
    quantizes). Every other warning is left as it is."""
    for message in _IMPORT_NAGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    warnings.filterwarnings("ignore", message=r"You are using `torch.load` with `weights_only=False`",
                            category=FutureWarning, module=r"colossalai\.")   # its checkpoint IO reading coati's own files
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_DropMessage("Failed to load CPU gemm_4bit_forward"))


_quiet_third_party_imports()
