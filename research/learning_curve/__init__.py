"""`python -m research learning-curve`: accuracy against the number of examples a user has labelled.

schedule.py (what is labelled when), client.py (every HTTP call), service.py (the simulated labeller
driving the service), baselines.py (the same examples, in-process), report.py (results files, tables,
plot, the target check), run.py (the stack and the loop over tasks, seeds and orders).
"""
