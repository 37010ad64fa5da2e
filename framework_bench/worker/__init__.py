"""The worker SDK: what a backend's worker (running inside the backend's own env) builds on.

Stdlib + numpy at import time; torch is imported lazily inside the helpers that need it,
so the host can import this package too (it never calls the torch parts).
"""
