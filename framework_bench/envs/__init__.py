"""Each backend's own venv: where it lives and whether it is ready (`venvs`), how it is made
(`creation`, `pip_options`, `torch_index`, `smoke`, `sdk_check`, `host_packages`), and the
layering over a venv host (`site_layers`, standard library only).
"""
