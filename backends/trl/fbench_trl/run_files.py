"""The files a TRL run folder holds, named once for the plugin (host) and the worker (trl env)."""

RUN_FILE = "trl_run.json"  # {"sft_config": SFTConfig kwargs, "attn_implementation": the model's}
DEEPSPEED = "deepspeed_config.json"
OUTPUT_DIR = "trl_output"
