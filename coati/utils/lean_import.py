"""Imported before `colossalai.booster` (and imports it): colossalai's booster without the cost of compiling nothing.

colossalai's booster imports modules (its fp8 kernels, bitsandbytes through its quantization and GaLore) that wrap
functions in `torch.compile` at import time. Each wrap imports torch's inductor (about a second) and makes torch warm
a pool of `compile_threads` worker processes in every rank, each importing torch again. coati calls none of those
functions. So while `colossalai.booster` is imported here, `torch.compile` of a function returns one that compiles
itself on its first call (never, in a coati run), and inductor's `compile_threads` is 1 unless the user set
`TORCHINDUCTOR_COMPILE_THREADS` (measured before the deferral: 2.6 s of wall clock per two-process launch)."""
import contextlib
import functools
import os
from typing import Any, Callable, Iterator, Optional

import torch
import torch._inductor.config as inductor_config


@contextlib.contextmanager
def compile_on_first_call() -> Iterator[None]:
    """Within the block, `torch.compile(fn, ...)` of a plain function (also as a decorator) defers the compilation to
    the function's first call; modules are compiled as usual."""
    real_compile = torch.compile

    def deferred(model: Optional[Callable] = None, **options: Any) -> Any:
        if model is None:
            return lambda fn: deferred(fn, **options)
        if isinstance(model, torch.nn.Module):
            return real_compile(model, **options)
        compiled: Optional[Callable] = None

        @functools.wraps(model)
        def first_call(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = real_compile(model, **options)
            return compiled(*args, **kwargs)

        return first_call

    torch.compile = deferred
    try:
        yield
    finally:
        torch.compile = real_compile


if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
    inductor_config.compile_threads = 1

with compile_on_first_call():
    import colossalai.booster  # noqa: F401,E402
