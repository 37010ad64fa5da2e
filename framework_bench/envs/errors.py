"""The error every step of making or reading a backend's env raises: the CLI prints it, no traceback."""


class EnvError(RuntimeError):
    pass
