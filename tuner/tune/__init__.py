"""`tuner tune`: find the flags that serve the most traffic within the SLO, by measuring them.

workload (signals/workload.py) -> space.py (axes, feasibility by the memory model) -> search.py (optuna TPE) ->
capacity.py (bracketing the rate of one config) -> bench.py (vLLM's own benchmark client). The use case that
starts trial servers and journals them is tuner/app/tune.py.
"""
