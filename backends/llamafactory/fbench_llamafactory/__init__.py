"""LLaMA-Factory backend: plugin (host side), argument writer, and the worker run inside
the backend's own env (`.fbench/envs/llamafactory`)."""
