"""The controller's policy: pure functions of what was observed (decide and what it reads).

Nothing here performs I/O: no API calls, no clock, no files, no threads
(tests/operator_core/test_decide_purity.py checks every module of this package)."""
