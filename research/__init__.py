"""The laboratory: the evaluation grids, learning curves, judge splits, peers and benchmarks behind the
numbers in docs/, with its own command line, `python -m research <command>` (research/cli/).

It runs from a checkout (the repository root on sys.path) and is not installed with the product.
Arrows point down only: research imports `services` and `openbook`; they never import it.
"""

PROG = "python -m research"  # how its commands are typed, and recorded in the results they write
