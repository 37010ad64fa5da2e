"""Names vulture (tests/test_lint.py) cannot see used: parameters whose presence a caller outside
fbench's code requires."""

frame  # noqa: B018 - signal.signal calls a handler as handler(signum, frame) (run/interrupts.py)
control  # noqa: B018 - HF's CallbackHandler calls each callback event as event(args, state, control, **kwargs) (worker/hf_trainer.py)
