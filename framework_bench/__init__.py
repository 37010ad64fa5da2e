"""fbench: benchmark fine-tuning frameworks on identical packed-Alpaca scenarios.

Importing this package must stay cheap: the host never imports torch or a framework.
"""

from framework_bench import _compat

__version__ = "0.2.0"

_compat.install()  # the deprecated module paths, each an alias of its new home until its removal release
