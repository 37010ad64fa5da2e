"""Two copies of the torch reference for benchmarks/aa_false_alarm.py: `torch_twin`, the same
worker under another name (an A/A pair), and `torch_slow`, the same worker with real extra
work in every step (a known slowdown)."""
