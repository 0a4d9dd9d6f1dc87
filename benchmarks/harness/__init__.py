"""What every scenario of `make bench` shares; the scenarios import from here and never from each other.

constants.py   the tool, timeouts, sizes of a run, the cores
processes.py   the processes a scenario starts: Redis, upstream, worker, gateway, the baseline
meter.py       a process tree's CPU and RSS, a server's commands, a run's Sample
figures.py     percentiles, labels, a target met or missed
load.py        the ways of sending calls: the clients in bursts or one at a time, the gateway's surfaces
upstream.py    the benchmark upstream (its own process): fixed latency and body size
baseline.py    the hand-written baseline: a Celery task calling `requests`
"""
