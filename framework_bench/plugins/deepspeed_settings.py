"""What a backend that trains through DeepSpeed declares about it: the settings keys its runs
record from the live DeepSpeed engine that move a step's time (`BackendInfo.speed_settings`),
and what matched mode leaves to each framework there (`BackendInfo.report_notes`). The host
itself knows no engine's keys (`framework_bench/run/compare.py` keeps only the common ones)."""

DEEPSPEED_SPEED_SETTINGS = [
    "zero_reduce_bucket_size", "zero_allgather_bucket_size", "zero_overlap_comm", "zero_contiguous_gradients",
    "zero_stage3_prefetch_bucket_size", "zero_stage3_param_persistence_threshold", "zero_stage3_max_live_parameters",
    "deepspeed_version",
]
DEEPSPEED_VERSION_NOTE = "DeepSpeed versions follow each framework's requirements (deepspeed_version)."
