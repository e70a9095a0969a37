"""tests/torch: precision_lab.torch against the numpy API. They need torch (the ``test`` extra
installs a CPU build); without it each module here skips, saying so (``pytest.importorskip`` at
its top)."""

import importlib.util

if importlib.util.find_spec("torch") is not None:
    import torch

    # one intra-op thread: the tensors here are small, and torch's thread pool on a shared
    # 2-core machine costs more than it gives (an im2col took 0.1 s instead of 1 ms under load)
    torch.set_num_threads(1)
