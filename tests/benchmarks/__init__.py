"""upgrade-gate's benchmarks (``nox -s benchmark -- NAME``: benchmark.py and a module per family, with the in-process measurement
servers of scripted.py) and the stacks they run; a tool of this repository, not of the installed package."""
