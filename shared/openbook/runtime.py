"""Process-wide settings of torch and FAISS, applied by entry points (CLI, api, worker), never on import."""

from __future__ import annotations

import faiss
import torch

# faiss-cpu 1.15 answers batches below `distance_compute_blas_threshold` queries (128000 in this
# build) with its per-query kernel. Measured on a 2-core x86 CPU, dim 576, k=16, one flat index of
# 100k: 32 queries take 236 ms that way and 36 ms through BLAS; 8 queries 62 ms vs 32 ms; 256 queries
# 178 ms either way; 1 query 17 ms either way. The classic threshold of 20 is never slower there.
FAISS_BLAS_THRESHOLD = 20


def configure(threads: int | None = None) -> None:
    """FAISS searches small query batches through BLAS; with `threads`, torch and FAISS use that many."""
    faiss.cvar.distance_compute_blas_threshold = FAISS_BLAS_THRESHOLD
    if threads is not None:
        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(threads)
