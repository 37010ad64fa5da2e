"""fbench: benchmark fine-tuning frameworks on identical packed-Alpaca scenarios.

Importing this package must stay cheap: the host never imports torch or a framework.
"""

from framework_bench import deprecations

__version__ = "0.3.0"

deprecations.install()  # the deprecated module paths, each an alias of its new home until its removal release
