"""The torch reference worker with one lie: `python -m fbench_lying_worker JOB LIE`.

Each lie is a list of (line of `fbench_torch/worker.py`, what replaces it). The worker's
source is read, each line replaced (it must occur exactly once, so a change of the real
worker breaks the lie loudly instead of leaving it dead) and run as `__main__`. No lie
changes more than `MAX_CHANGED_LINES` lines. Stdlib only at import: the host imports
`LIES` (and `lied_source`) too.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path

MAX_CHANGED_LINES = 15

TIMER = "    log = StepLog(job, dist.rank)\n"
BACKWARD = "                share.backward()\n"
CLOSE = "    log.close()\n"
FORWARD = "                        share = loss = train_model(input_ids=x, labels=y, num_items_in_batch=labelled).loss\n"
BUILT = ('    model = from_config(job, device, attn_implementation=ulysses.register(lay) if lay else "sdpa", '
         'dtype=torch.float32)\n')
PARAMS = "        param_count=settings.param_count(model),\n"
LEDGER = "        settings={**settings_in_effect, **adapters.settings(model)},\n"
INITIAL = "    initial_weights_worker.fill_revealed(model, job, log.timer.clock, optimizer)\n"
WRITE = "    write_report(job, report)\n"
UPDATE = "    update.report(model, job)  # (final - initial) weights onto the vector the host reveals now\n"
WARMUP = "    update.report_at_warmup_end(model, job, log.timer.clock)  # the weights when the warm-up ends, projected then\n"
OPTIMIZER = ("        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)\n        optimizer.step()\n"
             "        optimizer.zero_grad(set_to_none=True)\n")
OPTIMIZER_BUILT = "    optimizer = adamw([p for p in model.parameters() if p.requires_grad], cuda)\n"
END = "        log.end(step)  # the step's loss: its token mean, as the loop computed it\n"

LIES: dict[str, list[tuple[str, str]]] = {
    "honest": [],
    # Every step's claimed seconds halved, and the framework's own figure from the same clock.
    "halved_seconds": [
        (TIMER, TIMER + '    log.timer.writer.write = (lambda w: lambda **r: w(**{**r, "seconds": r["seconds"] / 2}))'
                        '(log.timer.writer.write)\n'
                        "    log.throughput = (lambda t: lambda: {k: v * 2 for k, v in t().items()})(log.throughput)\n"),
    ],
    # The embeddings never updated (their gradient dropped before each optimizer step), every
    # claim and count as the honest loop's: in bf16 the whole update's tolerance hides it.
    "frozen_embeddings": [(OPTIMIZER, "        model.get_input_embeddings().weight.grad = None\n" + OPTIMIZER)],
    # Every step's claimed seconds shaved to 0.95 of its time: within the clock check's 90% with room
    # for the time between steps, which the host's windows hold and the claims do not.
    "shaved_seconds": [
        (TIMER, TIMER + '    log.timer.writer.write = (lambda w: lambda **r: w(**{**r, "seconds": r["seconds"] * 0.95}))'
                        '(log.timer.writer.write)\n'
                        "    log.throughput = (lambda t: lambda: {k: v / 0.95 for k, v in t().items()})(log.throughput)\n"),
    ],
    # The backward pass outside the timed window with pause()/resume(), the pauses kept from the host.
    "backward_untimed": [
        (TIMER, TIMER + '    log.timer.clock.write = (lambda w: lambda e, s=None: None if e in ("pause", "resume") '
                        'else w(e, s))(log.timer.clock.write)\n'),
        (BACKWARD, "                log.timer.pause()\n" + BACKWARD + "                log.timer.resume()\n"),
    ],
    # The same, the pause declared: claimed = observed - pauses holds.
    "declared_pause": [
        (BACKWARD, "                log.timer.pause()\n" + BACKWARD + "                log.timer.resume()\n"),
    ],
    # Every step computed first, the clock lines held back; then written at the claimed pace.
    "compute_then_write": [
        (INITIAL, INITIAL + "    held, write = [], log.timer.clock.write\n"
                        "    log.timer.clock.write = lambda e, s=None: held.append((e, s))\n"),
        (CLOSE, "    claimed = iter(__import__('json').loads(l)['seconds'] for l in log.timer.writer.path.read_text().splitlines())\n"
                "    for e, s in held:\n"
                "        write(e, s), time.sleep(next(claimed) if e == 'begin' else 0)\n" + CLOSE),
    ],
    # No claim at all: no clock lines, no rows, no settings, no parameter count, no own throughput.
    "no_claims": [
        (TIMER, '    sys.modules["framework_bench.worker.loop"].ConsumedRows = type("NoRows", (), {"__init__": lambda *a: None, '
                '"add": lambda *a: None, "end_step": lambda *a: None, "close": lambda *a: None})\n'
                + TIMER + "    log.timer.clock.write = lambda e, s=None: None\n"),
        (WRITE, '    report.settings = report.param_count = None\n    report.extra["loop_throughput"] = {}\n' + WRITE),
        (UPDATE, ""),
        (INITIAL, "    initial_weights_worker.report(model, job.seed, job.run_dir)\n"),  # no ready line either
    ],
    # Every claim but the update projection (contract 3): a worker written for contract 2.
    "no_update_claim": [
        (UPDATE, ""),
    ],
    # The same, saying why it cannot make that claim on this run.
    "says_no_update": [
        (UPDATE, ""),
        (WRITE, '    report.unclaimed = {"update": "this loop keeps no initial weights"}\n' + WRITE),
    ],
    # The model fed the first half of each row; full rows recorded, full tokens claimed.
    "half_rows": [
        (FORWARD, FORWARD.replace("input_ids=x, labels=y", "input_ids=x[:, :x.shape[1] // 2], labels=y[:, :x.shape[1] // 2]")),
    ],
    # No optimizer step and no clipping: the weights never change.
    "no_update": [
        ("        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)\n", ""),
        ("        optimizer.step()\n", ""),
    ],
    # One layer of four trained; the parameter count claimed from the full model built on the meta device.
    "one_layer": [
        (BUILT, BUILT + "    model.model.layers = model.model.layers[:1]\n"),
        (PARAMS, '        param_count=settings.param_count(from_config(job, torch.device("meta"))),\n'),
        (LEDGER, '        settings={**settings_in_effect, **adapters.settings(from_config(job, torch.device("meta")))},\n'),
    ],
    # Every label ignored: loss 0.0 every step, nothing trained.
    "labels_ignored": [
        (FORWARD, FORWARD.replace("labels=y", "labels=torch.full_like(y, -100)")),
    ],
    # The model never runs: a made-up loss, no backward; rows, tokens, settings and count still claimed.
    "no_model": [
        (FORWARD, "                        share = loss = torch.tensor(6.2)\n"),
        (BACKWARD, ""),
    ],
    # SGD for AdamW, recording XTuner's loss_normalization words (the checks judge the records, never the words).
    "sgd_xtuner_words": [
        ("    optimizer = adamw([p for p in model.parameters() if p.requires_grad], cuda)\n",
         "    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)\n"),
        ('        loss_normalization=job.loss_scheme or "token mean over the optimizer step, labels counted after the shift, '
         'per rank"))\n', '        loss_normalization="LlamaForCausalLM token mean per micro-batch, labels counted after the shift; '
                           "mean over the step's 1 micro-batch(es)\"))\n"),
    ],
    # No gradient clipping.
    "no_clipping": [
        ("        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)\n", ""),
    ],
    # At grad_accum 2 each step's second micro-batch fed and recorded, never backpropagated.
    "dropped_micro": [
        (BACKWARD, "                share.backward() if i == 0 else None\n"),
    ],
    # Forward only inside the timed steps; the real training after the last step's clock line, untimed.
    "train_after_steps": [
        (INITIAL, INITIAL + "    for step, batch in enumerate(job.batches(rows, dist.rank, dist.world_size), start=1):\n"
                        "        log.timer.begin(), [train_model(input_ids=torch.from_numpy(i), labels=torch.from_numpy(l)) for i, l in batch]\n"
                        "        log.timer.add_tokens(sum(i.size for i, _ in batch)), log.timer.end(step, None)\n"
                        "    log.timer.begin = log.timer.end = lambda *a: {'tokens': 0}\n"),
    ],
    # Every step trained once the initial seed was revealed, before the first step's clock; the
    # timed steps then run forward only, recording the losses kept from that training.
    "trained_before_first_step": [
        (INITIAL, INITIAL + "    kept = []\n"
                            "    for batch in job.batches(rows, dist.rank, dist.world_size):\n"
                            "        divisors = loss_divisors(job.loss_scheme, [l for _, l in batch], summed_over_ranks(device))\n"
                            "        kept.append([model(input_ids=torch.from_numpy(i), labels=torch.from_numpy(l), num_items_in_batch=d).loss for (i, l), d in zip(batch, divisors)])\n"
                            "        [loss.backward() for loss in kept[-1]], torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM), optimizer.step(), optimizer.zero_grad(set_to_none=True)\n"),
        (FORWARD, "                        with torch.no_grad(): train_model(input_ids=x)\n"
                  "                        share = loss = kept[step - 1][i].detach()\n"),
        (BACKWARD, ""),
        (OPTIMIZER, ""),
    ],
    # The whole training inside warm-up step 1's clock, then every step again forward only.
    "trained_in_warmup": [
        (INITIAL, INITIAL + "    timer, log.timer = log.timer, type('Untimed', (), {'begin': lambda s: None, 'end': lambda s, *a: {'tokens': 0}, "
                        "'add_tokens': lambda s, n: None, 'close': lambda s: None})()\n    timer.begin()\n"),
        (CLOSE, "    for step, batch in enumerate(job.batches(rows, dist.rank, dist.world_size), start=1):\n"
                "        timer.begin() if step > 1 else None\n"
                "        [train_model(input_ids=torch.from_numpy(i), labels=torch.from_numpy(l)) for i, l in batch] if step > 1 else None\n"
                "        timer.add_tokens(sum(i.size for i, _ in batch)), timer.end(step, None)\n"
                "    log.timer = timer\n" + CLOSE),
    ],
    # Every step but the last claims half its seconds, the last one claims the halves too: the same total.
    "claims_moved": [
        (TIMER, TIMER + "    moved, write = [0.0], log.timer.writer.write\n"
                        "    def claim(**r):\n"
                        "        half = 0.0 if r['step'] == job.scenario.steps.total else r['seconds'] / 2\n"
                        "        moved[0] += half\n"
                        "        write(**{**r, 'seconds': r['seconds'] - half + (0.0 if half else moved[0])})\n"
                        "    log.timer.writer.write = claim\n"),
    ],
    # Clipping and the optimizer step after the step's clock stopped, before the next one's begins.
    "optimizer_between_steps": [
        (OPTIMIZER, ""),
        (END, END + OPTIMIZER),
    ],
    # No backward: nothing trains; the loss records copied from the newest torch run of the scenario
    # beside it (the reference's, when it ran first) at the start, in time, its own never written;
    # that run's update projections (when the warm-up ended, after training) copied once each seed is revealed.
    # A mixture-of-experts model's forward without the router's auxiliary loss, while the config,
    # and so the settings ledger, says it joins the training loss at the scenario's coefficient.
    "drops_router_aux_loss": [
        (FORWARD, FORWARD.replace("num_items_in_batch=labelled)", "num_items_in_batch=labelled, output_router_logits=False)")),
    ],
    "copies_reference": [
        (BACKWARD, ""),
        (TIMER, TIMER + "    ref = max(job.run_dir.parent.glob(f'*-{job.scenario.name}-torch-*'), key=lambda p: p.stat().st_mtime)\n"
                        "    shutil = __import__('shutil'); shutil.copy(ref / 'losses' / 'rank0.jsonl', job.run_dir / 'losses' / 'rank0.jsonl')\n"
                        "    log.losses.end_step = lambda step: None\n"),
        (UPDATE, "    update.wait_for_reveal(job.run_dir, timeout=60)\n"
                 "    shutil.copy(ref / 'update_projection.json', job.run_dir / 'update_projection.json')\n"),
        (WARMUP, "    log.timer.clock.after_end(job.scenario.steps.warmup, lambda: (update.wait_for_reveal(job.run_dir, 60, update.WARMUP_REVEAL_FILE), "
                 "shutil.copy(ref / update.WARMUP_UPDATE_FILE, job.run_dir / update.WARMUP_UPDATE_FILE)))\n"),
    ],
    # Keeps its final weights and loss records outside its run folder (beside the runs), once per
    # scenario; every later run of the scenario, whatever its seed, throws its training away and
    # replays them. (It trains all the same: steps that skip their work would be too short to time.)
    "replays_kept": [
        (TIMER, "    kept = job.run_dir.parent.parent / f'kept-{job.scenario.name}'\n" + TIMER
                + "    shutil = __import__('shutil')\n"
                  "    if kept.exists():  # the kept records in place from the start, its own never written\n"
                  "        shutil.copy(kept / 'rank0.jsonl', job.run_dir / 'losses' / 'rank0.jsonl'), setattr(log.losses, 'end_step', lambda step: None)\n"),
        (UPDATE, "    if kept.exists():\n"
                 "        model.load_state_dict(torch.load(kept / 'weights.pt'))\n"
                 "    else:\n"
                 "        kept.mkdir(), shutil.copy(job.run_dir / 'losses' / 'rank0.jsonl', kept / 'rank0.jsonl'), torch.save(model.state_dict(), kept / 'weights.pt')\n"
                 + UPDATE),
    ],
    # Trains the scenario's adapters (r=8) and reports those of a second model built with r=64: its
    # initial weights, parameter count and ledger (every claim of the larger adapters consistent).
    "claims_r64": [
        (BUILT, BUILT + "    job.scenario.finetune.rank = 64\n"
                        '    claimed = from_config(job, device, attn_implementation="sdpa", dtype=torch.float32)\n'
                        "    job.scenario.finetune.rank = 8\n"),
        (INITIAL, INITIAL + "    initial_weights_worker.fill_revealed(claimed, job, log.timer.clock)\n"),
        (PARAMS, "        param_count=settings.param_count(claimed),\n"),
        (LEDGER, "        settings={**settings_in_effect, **adapters.settings(claimed)},\n"),
    ],
    # AdamW's second-moment beta and weight decay as many pre-training recipes set them (0.95, 0.1).
    "adamw_otherwise": [
        (OPTIMIZER_BUILT, OPTIMIZER_BUILT.replace("adamw([p for p in model.parameters() if p.requires_grad], cuda)",
                                                  "torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], "
                                                  "lr=LEARNING_RATE, betas=(0.9, 0.95), eps=ADAM_EPS, weight_decay=0.1)")),
    ],
    # Attention dropout 0.1 in every layer (the model's config left saying 0.0).
    "dropout": [(BUILT, BUILT + "    [setattr(layer.self_attn, 'attention_dropout', 0.1) for layer in model.model.layers]\n")],
    # Each packed document attends to itself only: positions restart after every end-of-text token.
    "per_document_mask": [
        (FORWARD, "                        ends = ((x[0] == job.hf_config['eos_token_id']).nonzero().flatten() + 1).tolist()\n"
                  "                        pos = torch.cat([torch.arange(len(d), device=x.device) for d in torch.tensor_split(x[0], ends) if len(d)])[None]\n"
                  + FORWARD.replace("input_ids=x, labels=y", "input_ids=x, position_ids=pos, labels=y")),
    ],
    # No lie: the loop normalises as XTuner does (each micro-batch's token mean / their count), honestly.
    "honest_micro_means": [
        (TIMER, '    job.loss_scheme = "micro_mean_mean"\n' + TIMER),
    ],
}


def worker_path() -> Path:
    return Path(importlib.util.find_spec("fbench_torch.worker").origin)


def lied_source(lie: str) -> str:
    source = worker_path().read_text()
    for line, replacement in LIES[lie]:
        if source.count(line) != 1:
            raise SystemExit(f"lie {lie!r}: {line.strip()!r} occurs {source.count(line)} times in {worker_path()}")
        source = source.replace(line, replacement)
    return source


def changed_lines(lie: str) -> int:
    """Lines added plus lines removed from the real worker (a replaced line counts twice)."""
    diff = list(difflib.ndiff(worker_path().read_text().splitlines(), lied_source(lie).splitlines()))
    return sum(d.startswith(("+ ", "- ")) for d in diff)


def run(more: dict[str, list[tuple[str, str]]] | None = None) -> None:
    """`python -m MODULE JOB LIE`: the lie's worker run as the real one (`more`: a module's lies of
    its own, added to LIES in this process only: LIES names the plugins of this module)."""
    job_file, lie = sys.argv[1], sys.argv[2]
    LIES.update(more or {})
    worker = str(worker_path())
    sys.argv = [worker, job_file]
    exec(compile(lied_source(lie), worker, "exec"), {"__name__": "__main__", "__file__": worker})


def plugins_of(module: str, lies: dict[str, list[tuple[str, str]]], env: dict[str, str] | None = None):
    """The `__getattr__` of a module of more lies: `lying_<lie>` is its plugin, a `LyingBackend`
    running `module` with `env` (made on demand: it imports the torch plugin, which the worker never needs)."""
    def plugin(name: str):
        lie = name.removeprefix("lying_")
        if lie not in lies:
            raise AttributeError(name)
        from fbench_lying_backends import LyingBackend
        return LyingBackend(lie, module=module, env=env)
    return plugin


if __name__ == "__main__":
    run()
