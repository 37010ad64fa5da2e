"""Backends bundled with fbench, each a plugin package registered through the
`fbench.backends` entry-point group, exactly like a third-party backend."""
