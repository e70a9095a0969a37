"""The C++ sources of precision_lab's compiled extensions, and their fingerprint.

Standard library only: ``setup.py`` loads this file by path (the package's dependencies are not
installed yet when it builds), hashes the sources of each extension and compiles the hash into it
(``SOURCE_HASH``). At import, :mod:`precision_lab.backends.native` hashes the files it finds in the
package again: a different hash means the extension was built from other sources (an edited header
in an editable install), and it is not used.

>>> "precision_lab.backends._native" in EXTENSIONS
True
>>> len(source_hash(["native/sources.py"]))
16
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: folder of the backends (precision_lab/backends/): the source paths below are relative to it
PACKAGE = Path(__file__).resolve().parent.parent

#: extension module -> its source files (the .cpp files are compiled; all are hashed), relative
#: to the package folder
EXTENSIONS: dict[str, list[str]] = {
    # the translation units that take longest to compile first (setup.py compiles them in this
    # order on its threads)
    "precision_lab.backends._native": [
        "native/core_encode64.cpp",
        "native/core_encode32.cpp",
        "native/core_round.cpp",
        "native/core.cpp",
        "native/core.inc",
        "native/philox.inc",
        "native/fpenv.h",
        "cuda/pl_round.cuh",
    ],
    "precision_lab.backends._native_kernels": [
        "native/module.cpp",
        "native/kernels_base.cpp",
        "native/kernels_avx2.cpp",
        "native/kernels_avx512.cpp",
        "native/kernels.h",
        "native/fpenv.h",
        "native/common.inc",
        "native/kernels.inc",
        "native/fma32.inc",
        "native/blockfma_fast.inc",
        "native/quant.inc",
        "native/philox.inc",
        "native/blocks.inc",
        "native/hadamard.inc",
        "cuda/pl_round.cuh",
        "cuda/pl_gemm.cuh",
    ],
}

#: how to rebuild the extensions (said by the warning when one is missing or stale)
REBUILD = (
    "pip install -e . in the source checkout (or make native); an installed package: reinstall it "
    "where a C++ compiler is available"
)


def source_hash(files: list[str], root: Path = PACKAGE) -> str:
    """First 16 hex digits of the SHA-256 of the files (names and contents, in order)."""
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]
