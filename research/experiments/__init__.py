"""The evaluation harness and what it reports: grids of methods x seeds on k-shot splits
(evaluation.py, training_eval.py, setfit_peer.py, reports.py), continual learning, the first-use and
kNN-selection checks, IPT's pretrained prompt table, and the library's performance benches."""
