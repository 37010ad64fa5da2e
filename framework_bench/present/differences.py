"""Which recorded settings differ between backends on one scenario, and which of them can move a
step's time: the table under a compare and the report's "Settings in effect"."""

from __future__ import annotations

from framework_bench.plugins import registry as plugins

# Settings every backend records that change a step's time (marked where backends differ);
# each backend adds the keys only its engine records (`BackendInfo.speed_settings`: speed_relevant).
# The rest (seed, learning rate, the other libraries' versions...) are shown but do not move TGS.
COMMON_SPEED_SETTINGS = frozenset({
    "trainer", "optimizer", "optimizer_impl", "grad_clip", "param_dtype", "autocast_dtype", "loss_scaler",
    "grad_reduce_dtype", "master_weights", "attention", "attention_kv_repeat", "activation_checkpointing",
    "checkpointing_reentrant", "zero_stage", "flash_attn_version", "sequence_parallel", "compile",
    "ddp_find_unused_parameters", "token_count_sync", "torch_version", "transformers_version",
    # the fine-tuning method (framework_bench/worker/adapters.py): what trains, and in which dtypes
    "finetune_method", "trainable_params", "lora_targets", "lora_head_adapted", "lora_rank", "lora_dropout",
    "lora_dora", "lora_bias", "base_dtype", "adapter_dtype", "base_frozen", "quant_type", "double_quant",
    "compute_dtype", "quant_storage",
})
# What matched mode cannot align because it lives inside the frameworks' own code (fairness
# audit rows), whatever the frameworks; each backend adds its own (`BackendInfo.report_notes`).
# Named in the report beside the recorded settings.
NOT_ALIGNED = (
    "Each framework's transformers pin decides whether SDPA repeats grouped K/V heads "
    "(attention_kv_repeat) and the default checkpointing variant.",
    "Rows are fed in the host's order on both sides (no shuffling): the host checks each step's rows.",
)


def speed_relevant() -> frozenset[str]:
    """The settings keys that can move TGS: the common ones and each installed backend's own."""
    return COMMON_SPEED_SETTINGS.union(*(b.info.speed_settings for b in plugins.backends().values()))


def setting_differences(records: list[dict]) -> dict[str, list[tuple[str, dict[str, object], bool]]]:
    """Per scenario, each setting whose value differs between backends: (key, {backend: value},
    speed-relevant). `records` are run records (RunResult dumps or store rows) with `settings`."""
    by_scenario: dict[str, dict[str, dict]] = {}
    for r in records:
        if r.get("settings"):
            by_scenario.setdefault(r["scenario"], {})[r["backend"]] = r["settings"]
    out: dict[str, list[tuple[str, dict[str, object], bool]]] = {}
    speed = speed_relevant()
    for name, per_backend in by_scenario.items():
        if len(per_backend) < 2:
            continue
        # a key one backend does not record is unknown there, not a difference
        keys = sorted(set.intersection(*(set(s) for s in per_backend.values())) - {"settings_mode"})
        diffs = []
        for key in keys:
            values = {b: s.get(key) for b, s in sorted(per_backend.items())}
            if len({repr(v) for v in values.values()}) > 1:
                diffs.append((key, values, key in speed))
        out[name] = sorted(diffs, key=lambda d: (not d[2], d[0]))
    return out
