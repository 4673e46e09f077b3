"""Isolation: how a child process is confined and ended (its uid, namespaces, cgroup, rlimits, capabilities, the
pause that freezes it, the sweep of what it left) and how its build dir is kept from one evaluation to the next.
No torch, and nothing here knows what the child computes: that protocol is the evaluation package's."""
