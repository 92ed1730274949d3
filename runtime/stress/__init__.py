"""``vnpu stress-test``: an open-loop load generator against a running server, with faults injected by the
same injector as ``vnpu chaos``, its request history checked by the same independent checker
(:mod:`runtime.cluster.history_check`), and a report of capacity, risks, self-healing actions and advice."""
