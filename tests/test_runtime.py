"""Process-wide FAISS and torch settings (`runtime.configure`): applied when asked, never on import."""

from __future__ import annotations

import os
import subprocess
import sys

import faiss
import pytest
import torch
from openbook.runtime import FAISS_BLAS_THRESHOLD, configure


@pytest.fixture
def restore_process_settings():
    """configure() changes the whole test process: put back what it found."""
    blas, torch_threads, faiss_threads = (
        faiss.cvar.distance_compute_blas_threshold,
        torch.get_num_threads(),
        faiss.omp_get_max_threads(),
    )
    yield
    faiss.cvar.distance_compute_blas_threshold = blas
    torch.set_num_threads(torch_threads)
    faiss.omp_set_num_threads(faiss_threads)


def test_configure_sends_small_batches_through_blas(restore_process_settings) -> None:
    faiss.cvar.distance_compute_blas_threshold = 128_000  # faiss-cpu's own default
    threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    configure()
    assert faiss.cvar.distance_compute_blas_threshold == FAISS_BLAS_THRESHOLD == 20
    assert (torch.get_num_threads(), faiss.omp_get_max_threads()) == threads  # no threads given: untouched


def test_configure_threads_sets_torch_and_faiss(restore_process_settings) -> None:
    wanted = 1 if torch.get_num_threads() != 1 else 2  # a value that differs from the current one
    configure(threads=wanted)
    assert torch.get_num_threads() == wanted and faiss.omp_get_max_threads() == wanted


def test_importing_the_library_changes_no_faiss_setting() -> None:
    code = (
        "import faiss; before = faiss.cvar.distance_compute_blas_threshold; "
        "import openbook.store, openbook.classifier, openbook.runtime; "
        "print(before, faiss.cvar.distance_compute_blas_threshold)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    before, after = out.stdout.split()
    assert after == before
