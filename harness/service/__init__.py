"""The service around the evaluation engine: queue workers, the compile pool, batch re-evaluation.
No torch here: evaluations run in the sandbox's child processes."""
