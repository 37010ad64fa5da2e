"""fbench: benchmark fine-tuning frameworks on identical packed-Alpaca scenarios.

Importing this package must stay cheap: the host never imports torch or a framework.
"""

__version__ = "0.1.0"
