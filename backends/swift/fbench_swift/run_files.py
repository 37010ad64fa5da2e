"""The files an ms-swift run folder holds, named once for the plugin (host) and the worker (swift env)."""

RUN_FILE = "swift_run.json"  # {"sft_args": SftArguments kwargs}
DEEPSPEED = "deepspeed_config.json"
OUTPUT_DIR = "swift_output"
ROWS_DIR = "swift_rows"  # the host's packed rows as an ms-swift cached dataset (`datasets` save_to_disk)
