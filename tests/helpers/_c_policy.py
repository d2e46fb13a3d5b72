"""Compile an exported C header with the system C compiler and run it on observations (export tests' helper)."""

from __future__ import annotations

import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

#: The value the test program puts in ``action`` before each call: still there means "not written".
SENTINEL = 12345.0

_MAIN_C = r"""
#include <stdio.h>
#include "policy.h"
int main(void) {
    float obs[UNILAB_OBS_DIM], action[UNILAB_ACT_DIM];
    while (fread(obs, sizeof(float), UNILAB_OBS_DIM, stdin) == UNILAB_OBS_DIM) {
        int i, status;
        for (i = 0; i < UNILAB_ACT_DIM; ++i) action[i] = %(sentinel)sf;
        status = unilab_policy_step(obs, action);
        fwrite(&status, sizeof(int), 1, stdout);
        fwrite(action, sizeof(float), UNILAB_ACT_DIM, stdout);
    }
    return 0;
}
"""

#: The strict flags every header must compile under.
STRICT = ("-std=c99", "-O2", "-Wall", "-Wextra", "-pedantic", "-Werror")


def compile_header(header: Path, flags: tuple[str, ...] = STRICT) -> Path:
    """Compile ``header`` (named ``policy.h``) with a test ``main``; the binary's path (skips without a compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    assert header.name == "policy.h"
    main = header.with_name("main.c")
    main.write_text(_MAIN_C % {"sentinel": repr(SENTINEL)})
    binary = header.with_name(f"policy_{zlib.crc32(' '.join(flags).encode()):08x}")  # one binary per flag set
    subprocess.run([cc, *flags, "-o", binary, main, "-lm"], check=True, capture_output=True)
    return binary


def run_binary(binary: Path, obs: np.ndarray, act_dim: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """``unilab_policy_step`` on each row of ``obs`` ``(n, O)``: return codes ``(n,)``, actions ``(n, act_dim)``."""
    obs = np.ascontiguousarray(obs, np.float32)
    ran = subprocess.run([binary], input=obs.tobytes(), capture_output=True, check=True, timeout=60)
    rows = np.frombuffer(ran.stdout, np.dtype([("status", np.intc), ("action", np.float32, act_dim)]))
    assert len(rows) == len(obs)
    return rows["status"].astype(int), rows["action"].copy()


def run_header(header: Path, obs: np.ndarray, act_dim: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """:func:`compile_header` with the strict flags, then :func:`run_binary` (``act_dim``: the policy's actions)."""
    return run_binary(compile_header(header), obs, act_dim)
