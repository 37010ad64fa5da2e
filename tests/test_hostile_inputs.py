"""Hostile but realistic input: every mistake is one clear line and exit 1, never a
traceback, never a silently wrong answer, never fbench's tables in another program's file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_bench.scenario import scenario
from framework_bench.cli import app
from framework_bench.data import alpaca
from framework_bench.measure.metrics import RunResult
from framework_bench.store.results import ResultStore
from framework_bench.store.schema import SCHEMA_VERSION
from framework_bench.scenario.scenario import DataSource, ScenarioError

TINY = scenario.SCENARIO_DIR / "tiny_cpu.yaml"


def one_error(result, *needles: str) -> str:
    """The run ended with exit 1 and exactly one `error:` line on stderr holding every needle."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


# 7. Unreadable scenario files and data

def test_a_non_utf8_scenario_file(tmp_path, monkeypatch):
    bad = tmp_path / "latin.yaml"
    bad.write_bytes("description: caf\xe9\n".encode("latin-1") + TINY.read_bytes())
    for command in (["validate", str(bad)], ["show", str(bad)]):
        one_error(cli(*command), "not UTF-8")
    monkeypatch.setattr(scenario, "SCENARIO_DIR", tmp_path)
    monkeypatch.setattr(scenario.scenario_paths, "__defaults__", (tmp_path,))
    result = cli("scenarios")
    assert result.exit_code == 0 and "invalid" in result.output and "UTF-8" in result.output


@pytest.mark.parametrize("content, needle", [
    (b'[{"instruction": "a", "input": "", "out', "not an Alpaca JSON file"),
    (b"[1, 2, 3]", "record 0 is int"),
    (b'[{"instruction": 5, "input": "", "output": "x"}]', "instruction is int"),
    (b'[{"instruction": "a", "input": "", "output": null}]', "output is NoneType"),
    (b"[]", "non-empty list"),
    (bytes(range(256)) * 4, "not an Alpaca JSON file"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),  # was a RecursionError
    (b'[{"instruction": "a\\ud800", "input": "", "output": "x"}]', "lone UTF-16 surrogate"),  # was a TypeError
])
def test_bad_alpaca_files(tmp_path, fbench_home, content, needle):
    data = tmp_path / "alpaca.json"
    data.write_bytes(content)
    with pytest.raises(alpaca.DataError, match=needle.replace("(", r"\(")):
        alpaca.load_source(DataSource(path=str(data)))
    s = tmp_path / "bad_data.yaml"
    s.write_text(f"model: {{preset: tiny-llama}}\ncluster: {{device: cpu}}\ncontext_length: 512\n"
                 f"dataset: {{sources: [{{path: {data}}}]}}\n")
    one_error(cli("pack", str(s)), str(data))


def test_an_endless_device_is_no_scenario_and_no_alpaca_file(tmp_path, fbench_home):
    one_error(cli("validate", "/dev/zero"), "not a regular file")
    with pytest.raises(alpaca.DataError, match="not a regular file"):
        alpaca.load_source(DataSource(path="/dev/zero"))


def test_inline_model_errors_name_their_place_and_rope_theta_is_finite(tmp_path):
    inline = tmp_path / "inline.yaml"
    inline.write_text("model: {config: {hidden_size: 64}}\ncontext_length: 512\n")
    assert "model: config.num_hidden_layers: Field required" in cli("validate", str(inline)).stderr
    rope = tmp_path / "rope.yaml"
    rope.write_text("model: {preset: tiny-llama, config: {rope_theta: .inf}}\ncontext_length: 512\n")
    one_error(cli("validate", str(rope)), "config.rope_theta", "not a finite number")


def test_a_null_input_is_an_empty_input(tmp_path):
    data = tmp_path / "alpaca.json"
    data.write_text('[{"instruction": "a", "input": null, "output": "b"}]')
    records, _ = alpaca.load_source(DataSource(path=str(data)))
    assert "### Input" not in alpaca.format_record(records[0])[0]


def test_tokenizer_path_that_does_not_exist(tmp_path, fbench_home):
    s = tmp_path / "tok.yaml"
    s.write_text(TINY.read_text().replace("kind: builtin-bytes", f"kind: path\n    name: {tmp_path / 'nowhere'}"))
    one_error(cli("pack", str(s)), "no tokenizer.json")
    (tmp_path / "garbage.json").write_text("not json")
    s.write_text(TINY.read_text().replace("kind: builtin-bytes", f"kind: path\n    name: {tmp_path / 'garbage.json'}"))
    one_error(cli("pack", str(s)), "cannot load")


# 7, 10. Results files that fbench cannot or must not use

def _bad_dbs(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "a_folder"
    folder.mkdir()
    noise = tmp_path / "noise.sqlite"
    noise.write_bytes(os.urandom(8192))
    good = tmp_path / "good.sqlite"
    with ResultStore(good) as store:
        for _ in range(30):
            store.add(RunResult(backend="x", scenario="tiny_cpu", status="failed", reason="r" * 2000),
                      scenario.load("tiny_cpu"), manifest_={})
    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    newer = tmp_path / "newer.sqlite"
    newer.write_bytes(good.read_bytes())
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    foreign = tmp_path / "other_app.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE contacts (name TEXT)")
        conn.execute("PRAGMA user_version = 7")
    return {"folder": folder, "noise": noise, "truncated": truncated, "newer": newer, "foreign": foreign}


@pytest.mark.parametrize("command", [
    ["results", "list"], ["results", "show", "1"], ["results", "export"], ["plot"], ["report"],
    ["run", "--backend", "xtuner", "--scenario", "tiny_cpu"], ["compare", "--scenario", "tiny_cpu"],
])
def test_unusable_results_files_are_one_line_on_every_command(tmp_path, fbench_home, command):
    for kind, db in _bad_dbs(tmp_path).items():
        before = db.read_bytes() if db.is_file() else None
        line = one_error(cli(*command, "--db", str(db)), str(db))
        assert {"folder": "folder", "noise": "not a usable", "truncated": "results file", "newer": "schema version",
                "foreign": "another application"}[kind] in line, (kind, line)
        if before is not None:
            assert db.read_bytes() == before, f"{kind}: fbench wrote into a file it refused"


def test_a_foreign_database_is_left_untouched(tmp_path):
    foreign = _bad_dbs(tmp_path)["foreign"]
    with pytest.raises(Exception, match="another application"):
        ResultStore(foreign)
    with sqlite3.connect(foreign) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["contacts"]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7


def test_an_empty_file_and_a_store_from_before_the_application_id_are_ours(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    ResultStore(empty).close()
    legacy = tmp_path / "legacy.sqlite"
    with ResultStore(legacy):
        pass
    with sqlite3.connect(legacy) as conn:
        conn.execute("PRAGMA application_id = 0")  # what fbench wrote before it stamped its files
    with ResultStore(legacy) as store:
        assert store.list() == []


def test_a_fresh_store_opened_by_several_processes_at_once(tmp_path):
    db = tmp_path / "new.sqlite"
    code = ("import sys; from framework_bench.store.results import ResultStore; ResultStore(sys.argv[1]).close(); "
            "print('ok')")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [e for _, e in outs]
    with ResultStore(db) as store:
        assert store.list() == []


def test_results_show_with_a_huge_id(tmp_path):
    ResultStore(tmp_path / "r.sqlite").close()
    one_error(cli("results", "show", str(10**30), "--db", str(tmp_path / "r.sqlite")), "no run with id")


# 3. Unwritable outputs found before anything runs

def test_unwritable_out_and_store_are_found_before_launching(tmp_path, fbench_home):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    one_error(cli("compare", "--scenario", "tiny_cpu", "--backends", "xtuner", "--db", str(tmp_path / "r.sqlite"),
                  "--out", str(blocker / "plots")), "--out folder")
    one_error(cli("run", "--backend", "xtuner", "--scenario", "tiny_cpu", "--db", str(blocker / "r.sqlite")),
              "cannot open the results file")
    assert not (fbench_home / "runs").exists() or not any((fbench_home / "runs").iterdir())
    one_error(cli("plot", "--published", "--out", str(blocker / "plots")), "--out folder")


# 8. User strings are never read as rich markup

def test_brackets_in_names_and_messages_are_printed_as_written(tmp_path):
    bad = tmp_path / "Bad-Name.yaml"
    bad.write_text(TINY.read_text())
    result = cli("validate", str(bad))
    assert result.exit_code == 1 and "^[a-z0-9_]+$" in result.stderr
    odd = tmp_path / "m[" / "red]x.yaml"  # the path reads m[/red]x.yaml
    odd.parent.mkdir()
    odd.write_text("model: {preset: nope}\n")
    result = cli("validate", str(odd))
    assert result.exit_code == 1 and "m[/red]x.yaml" in result.stderr and "Traceback" not in result.output
    fine = tmp_path / "m_x.yaml"
    fine.write_text(TINY.read_text().replace("description:", "description: '[bold]not bold[/bold]'\n#"))
    result = cli("show", str(fine))
    assert result.exit_code == 0 and "[bold]not bold[/bold]" in result.stdout


# 9. Numbers are strict

@pytest.mark.parametrize("field, value", [
    ("context_length", "true"), ("context_length", "512.0"), ("micro_batch", "true"), ("grad_accum", "2.0"),
    ("sequence_parallel", "'1'"), ("zero_stage", "true"), ("zero_stage", "1.0"), ("activation_checkpointing", "1"),
])
def test_no_booleans_or_floats_where_integers_belong(tmp_path, field, value):
    text = "\n".join(l for l in TINY.read_text().splitlines() if not l.startswith(f"{field}:"))
    f = tmp_path / "strict.yaml"
    f.write_text(text + f"\n{field}: {value}\n")
    with pytest.raises(ScenarioError, match=field):
        scenario.load_file(f)


@pytest.mark.parametrize("where", ["cluster: {device: cpu, gpus_per_node: true}", "steps: {warmup: 1, measured: 2.0}",
                                   "model: {preset: tiny-llama, config: {hidden_size: 256.0}}",
                                   "dataset: {name: alpaca-enzh-demo, repeat: true}"])
def test_nested_numbers_are_strict_too(tmp_path, where):
    key = where.split(":")[0]
    kept = []
    skipping = False
    for line in TINY.read_text().splitlines():
        if line.startswith(f"{key}:"):
            skipping = True
            continue
        if skipping and line.startswith(" "):
            continue
        skipping = False
        kept.append(line)
    f = tmp_path / "strict.yaml"
    f.write_text("\n".join(kept) + "\n" + where + "\n")
    with pytest.raises(ScenarioError):
        scenario.load_file(f)


# 11. One name, two files

def test_two_scenario_files_with_one_name_are_refused(tmp_path, fbench_home):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "tiny_cpu.yaml").write_text(TINY.read_text())
    line = one_error(cli("compare", "--scenario", str(tmp_path / "a" / "tiny_cpu.yaml"), "--scenario",
                         str(tmp_path / "b" / "tiny_cpu.yaml"), "--db", str(tmp_path / "r.sqlite")),
                     "two scenarios named 'tiny_cpu'")
    assert str(tmp_path / "a" / "tiny_cpu.yaml") in line and str(tmp_path / "b" / "tiny_cpu.yaml") in line
    one_error(cli("compare", "--scenario", "tiny_cpu", "--scenario", str(tmp_path / "a" / "tiny_cpu.yaml"),
                  "--dry-run"), "two scenarios named")


# 13. CLI edges

@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "inf"])
def test_timeouts_must_be_positive_and_finite(tmp_path, timeout):
    for command in (["run", "--backend", "xtuner", "--scenario", "tiny_cpu"], ["compare", "--scenario", "tiny_cpu"]):
        one_error(cli(*command, "--timeout", timeout, "--db", str(tmp_path / "r.sqlite")), "--timeout")


@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_scenario_name_is_refused_not_read_as_this_folder(tmp_path, fbench_home, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # '' was this folder: "cannot read: not a regular file"
    db = str(tmp_path / "r.sqlite")
    for command in (["run", "--backend", "torch", "--db", db, "--scenario", name],
                    ["compare", "--backends", "torch", "--db", db, "--scenario", "tiny_cpu", "--scenario", name],
                    ["compare", "--backends", "torch", "--dry-run", "--scenario", name],
                    ["check-backend", "torch", "--scenario", name], ["show", name], ["pack", name]):
        one_error(cli(*command), f"an empty scenario name ({name!r})")


@pytest.mark.parametrize("option", ["", ",", "xtuner,,llamafactory", " , "])
def test_empty_backend_names_are_refused(tmp_path, option):
    one_error(cli("compare", "--scenario", "tiny_cpu", "--backends", option, "--dry-run"), "--backends")


def test_backend_names_are_stripped_and_run_once(fbench_home):
    result = cli("compare", "--scenario", "tiny_cpu", "--backends", " xtuner , xtuner,llamafactory", "--dry-run",
                 "--json")
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)  # --json: stdout is the JSON alone
    assert [p["backend"] for p in plans] == ["xtuner", "llamafactory"]
    assert {"argv", "env", "files", "launcher", "check"} <= plans[0].keys()


def test_local_launcher_with_several_processes_is_one_error(tmp_path):
    for command in (["run", "--backend", "xtuner", "--scenario", "multiproc_tiny_cpu_1x2"],
                    ["compare", "--scenario", "multiproc_tiny_cpu_1x2"]):
        one_error(cli(*command, "--launcher", "local", "--db", str(tmp_path / "r.sqlite")), "--launcher local")


def test_a_backend_name_too_long_for_a_run_folder_is_one_line(fakes, tmp_path, monkeypatch):
    """A plugin's name is not bounded as a scenario's is: a run folder named after a 250-byte one
    is over a file name's 255 bytes (the dry run raised an OSError, a run was stored failed)."""
    long = "b" * 250
    site = tmp_path / "long-site"
    site.mkdir()
    (site / "fbench_long_backend.py").write_text("from fbench_fake_backends import FakeBackend\n"
                                                 f"plugin = FakeBackend('fake_long', 'ok', info_name={long!r})\n")
    fakes.register_through_entry_points(site, {long: "fbench_long_backend:plugin"}, distribution="fbench-long")
    monkeypatch.syspath_prepend(str(site))
    db = tmp_path / "r.sqlite"
    for command in (["run", "--backend", long, "--scenario", "tiny_cpu", "--db", str(db)],
                    ["compare", "--backends", long, "--scenario", "tiny_cpu", "--db", str(db)],
                    ["compare", "--backends", long, "--scenario", "tiny_cpu", "--dry-run"],
                    ["check-backend", long]):
        one_error(cli(*command), "over the 255 a file name may have", "shorter name")
    assert not db.exists()


@pytest.mark.parametrize("value, said", [
    ("nope", "FBENCH_REFERENCE='nope' names no installed backend (installed: "),
    ("fake_broken", "FBENCH_REFERENCE='fake_broken' names a broken backend: ModuleNotFoundError"),
])
@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_reference_pinned_to_no_working_backend_is_refused_before_any_run(fakes, tmp_path, monkeypatch, value, said):
    """Every run was stored `unverified`, saying "no reference backend is installed": untrue, and
    silent about the value. --no-reference still runs without one, as it did."""
    site = tmp_path / "broken-site"
    fakes.register_through_entry_points(site, {"fake_broken": "fbench_no_such_module:plugin"}, distribution="fbench-broken")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FBENCH_REFERENCE", f" {value} ")
    db = tmp_path / "r.sqlite"
    for command in (["run", "--backend", "fake_ok", "--scenario", "tiny_cpu", "--db", str(db)],
                    ["compare", "--backends", "fake_ok", "--scenario", "tiny_cpu", "--db", str(db)],
                    ["compare", "--backends", "fake_ok", "--scenario", "tiny_cpu", "--dry-run"],
                    ["check-backend", "fake_ok"]):
        one_error(cli(*command), said)
    assert not db.exists()
    res = cli("run", "--backend", "fake_ok", "--scenario", "tiny_cpu", "--db", str(db), "--no-reference")
    assert "error:" not in res.stderr, res.output
    with ResultStore(db) as store:
        [row] = store.list()  # never ok without a reference; on a loaded machine a timing check may fail first
    assert row["status"] != "ok" and "parity" not in [c["name"] for c in row["checks"]], row


@pytest.mark.slow  # starts a framework's or the host's own process
def test_a_reference_pinned_with_spaces_around_it_is_that_backend(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FBENCH_REFERENCE", " fake_ok")
    res = cli("compare", "--backends", "fake_noisy", "--scenario", "tiny_cpu", "--db", str(tmp_path / "r.sqlite"),
              "--out", str(tmp_path / "plots"))
    assert "error:" not in res.stderr, res.output
    with ResultStore(tmp_path / "r.sqlite") as store:
        rows = store.list()
    # the reference ran (it judges the round's runs: stored first), and nothing says there was none
    assert [r["backend"] for r in rows] == ["fake_ok", "fake_noisy"], rows
    assert "no reference" not in (rows[1]["reason"] or ""), rows[1]


def test_far_more_cpu_processes_than_cores_is_unsupported(tmp_path, fbench_home):
    f = tmp_path / "many.yaml"
    f.write_text(TINY.read_text().replace("gpus_per_node: 1", f"gpus_per_node: {10**9}"))
    result = cli("run", "--backend", "xtuner", "--scenario", str(f), "--db", str(tmp_path / "r.sqlite"))
    assert result.exit_code == 0 and "unsupported" in result.stdout and "CPU cores" in result.stdout
    assert "Traceback" not in result.output


def test_a_cpu_scenario_beyond_this_machines_memory_is_refused_with_the_figures(fakes, tmp_path):
    """A LoRA rank of 10^9 passed every check before the run (the dry run's own estimate: ~278,000
    GiB a process); so did a model of 10^7 layers, here on a backend without LoRA."""
    from framework_bench.run.refusals import ram_refusal
    lora = tmp_path / "huge_rank.yaml"
    lora.write_text((scenario.SCENARIO_DIR / "tiny_cpu_lora.yaml").read_text().replace("rank: 8", f"rank: {10**9}"))
    said = ram_refusal(scenario.load(str(lora)), None, "matched")
    assert said.startswith("1 process(es) x ~278,1") and "would not fit in this machine's" in said, said
    deep = tmp_path / "deep.yaml"
    deep.write_text(TINY.read_text().replace("preset: tiny-llama", f"preset: tiny-llama\n  config: {{num_hidden_layers: {10**7}}}"))
    db = tmp_path / "r.sqlite"
    result = cli("run", "--backend", "fake_ok", "--scenario", str(deep), "--db", str(db), "--no-reference")
    assert "Traceback" not in result.output, result.output
    with ResultStore(db) as store:
        [row] = store.list()  # refused before packing (failed here, with no fake_ok env made: its setup to finish)
    reason = " ".join(row["reason"].split())
    assert row["steps_measured"] in (0, None) and "would not fit in this machine's" in reason, row
    assert "GiB of memory; --force runs it anyway" in reason
    plan = cli("compare", "--backends", "fake_ok", "--scenario", str(deep), "--dry-run", "--force")
    assert plan.exit_code == 0 and "would not fit" not in plan.output, plan.output
    assert ram_refusal(scenario.load("multiproc_tiny_cpu_1x2"), None, "matched") is None  # what CI runs fits


# 7. A damaged env record

@pytest.mark.parametrize("record", ["{not json", "[]", '{"flavour": "gpu", "versions": {}, "requirements_sha256": "x"}',
                                    '{"versions": {}}'])
def test_a_corrupt_env_record_is_a_broken_env_not_a_traceback(fbench_home, tmp_path, record):
    env = fbench_home / "envs" / "xtuner"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").touch()
    (env / "fbench-env.json").write_text(record)
    for command in (["env", "list"], ["backends"]):
        result = cli(*command)
        assert result.exit_code == 0 and "Traceback" not in result.output
        assert "broken" in result.output and "unreadable" in result.output
    result = cli("run", "--backend", "xtuner", "--scenario", "tiny_cpu", "--db", str(tmp_path / "r.sqlite"))
    said = " ".join(result.stdout.split())  # the record's path is tmp_path's: as long as it, wrapped anywhere
    assert result.exit_code == 1 and "failed" in said and "fbench env create xtuner" in said


# What were tracebacks or silences, each one clear line now.

def _scenario_file(tmp_path: Path, text: str, name: str = "hostile") -> Path:
    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    return f


def test_a_duplicate_key_in_a_scenario_is_an_error_naming_the_key_and_its_line(tmp_path):
    f = _scenario_file(tmp_path, TINY.read_text() + "micro_batch: 2\n")
    line_no = TINY.read_text().count("\n") + 1
    one_error(cli("validate", str(f)), "duplicate key 'micro_batch'", f"line {line_no}")
    nested = _scenario_file(tmp_path, TINY.read_text().replace("  warmup: 2\n", "  warmup: 2\n  warmup: 3\n"), "nested")
    one_error(cli("show", str(nested)), "duplicate key 'warmup'")


@pytest.mark.parametrize("text, needle", [
    ("description: " + "[" * 20_000 + "]" * 20_000 + "\n", "nested too deeply"),
    ("description: {" + "a: {" * 20_000 + "}" * 20_001 + "\n", "nested too deeply"),
    ("micro_batch: " + "7" * 5_000 + "\n", "5000 digits"),  # was a ValueError from int()
])
def test_deep_nesting_and_huge_integers_are_one_line(tmp_path, text, needle):
    f = _scenario_file(tmp_path, TINY.read_text().replace("micro_batch: 1\n", "") + text)
    for command in ("validate", "show"):
        one_error(cli(command, str(f)), needle)


def test_a_published_figure_too_small_to_divide_by_is_refused_at_validation(tmp_path):
    text = TINY.read_text() + "reference: {tgs: 5.0e-324, tflops: 1.0, hardware: A100, framework: torch}\n"
    f = _scenario_file(tmp_path, text)
    one_error(cli("validate", str(f)), "reference.tgs")
    f.write_text(text.replace("5.0e-324", "1.0e308"))
    one_error(cli("validate", str(f)), "reference.tgs")
    f.write_text(text.replace("5.0e-324", "2500"))
    result = cli("show", str(f))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output


def test_a_scenario_through_a_symlink_loop_is_one_line(tmp_path, fbench_home):
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(tmp_path / "loop2.yaml")
    (tmp_path / "loop2.yaml").symlink_to(loop)
    for command in (["show", str(loop)], ["validate", str(loop)],
                    ["compare", "--scenario", str(loop), "--backends", "torch", "--dry-run"]):
        one_error(cli(*command), str(loop))
    bare = tmp_path / "bare"
    bare.symlink_to(bare)
    one_error(cli("show", str(bare)), str(bare))


def test_an_invalid_scenario_of_the_users_leaves_the_others_usable(tmp_path, fbench_home):
    (fbench_home / "scenarios").mkdir(parents=True)
    (fbench_home / "scenarios" / "broken.yaml").write_text("model: {preset: nope}\n")
    assert "tiny_cpu" in [s.name for s in scenario.load_all()]
    result = cli("plot", "--published", "--out", str(tmp_path / "plots"))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    result = cli("scenarios", "--wide")  # where it is named, with why
    assert result.exit_code == 0 and "invalid" in result.output


@pytest.mark.slow  # starts a framework's or the host's own process
def test_an_invalid_scenario_of_the_users_fails_neither_compare_nor_report(fakes, fbench_home, tmp_path):
    (fbench_home / "scenarios").mkdir(parents=True)
    (fbench_home / "scenarios" / "broken.yaml").write_text("model: {preset: nope}\n")
    db, out = tmp_path / "r.sqlite", tmp_path / "plots"
    result = cli("compare", "--scenario", "tiny_cpu", "--backends", "fake_ok", "--db", str(db), "--out", str(out))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output  # was 1, after storing
    result = cli("report", "--db", str(db), "--out", str(out))
    assert result.exit_code == 0 and (out / "report.html").is_file(), result.output


def test_a_users_scenario_shadowing_a_bundled_one_is_shown(fbench_home):
    (fbench_home / "scenarios").mkdir(parents=True)
    (fbench_home / "scenarios" / "tiny_cpu.yaml").write_text(TINY.read_text().replace("micro_batch: 1", "micro_batch: 2"))
    result = cli("scenarios", "--wide")
    assert result.exit_code == 0, result.output
    row = next(l for l in result.stdout.splitlines() if l.startswith("│ tiny_cpu "))  # not qwen3_tiny_cpu's
    assert "[1]" in row and "over the bundled one" in result.stdout, result.stdout  # a footnote of its row
    assert scenario.shadowing(scenario.source_path("tiny_cpu")) is not None


def test_a_run_of_a_users_scenario_over_a_bundled_one_says_so_in_its_notes(fakes, fbench_home, tmp_path):
    (fbench_home / "scenarios").mkdir(parents=True)
    (fbench_home / "scenarios" / "tiny_cpu.yaml").write_text(TINY.read_text())
    db = tmp_path / "r.sqlite"
    result = cli("run", "--backend", "fake_ok", "--scenario", "tiny_cpu", "--db", str(db))
    assert result.exit_code == 0, result.output
    with ResultStore(db) as store:
        notes = store.list()[0]["notes"]
    assert any("over the bundled" in n and str(fbench_home / "scenarios") in n for n in notes), notes
    assert scenario.load(str(TINY)).shadow_note is None


@pytest.mark.parametrize("home", ["long", "not_utf8", "unwritable"])
def test_an_unusable_fbench_home_is_one_line(tmp_path, monkeypatch, home):
    value = {"long": str(tmp_path / ("h" * 4000)), "not_utf8": os.fsdecode(str(tmp_path).encode() + b"/caf\xe9"),
             "unwritable": "/proc/fbench-home"}[home]
    monkeypatch.setenv("FBENCH_HOME", value)
    for command in (["compare", "--scenario", "tiny_cpu", "--backends", "torch", "--dry-run"],
                    ["results", "list"], ["backends"]):
        one_error(cli(*command), "FBENCH_HOME")
    if home == "unwritable":  # reading scenarios needs no writable state folder
        assert cli("scenarios").exit_code == 0


def test_a_huge_alpaca_file_is_refused_by_its_size_before_reading(tmp_path, fbench_home):
    data = tmp_path / "alpaca.json"
    with data.open("wb") as fh:
        fh.truncate(1 << 30)  # 1 GiB, sparse: nothing is written
    with pytest.raises(alpaca.DataError, match="larger than"):
        alpaca.load_source(DataSource(path=str(data)))


def test_a_recovery_claim_named_with_odd_digits_is_left_alone_not_a_traceback(fbench_home, tmp_path):
    """`host.json.²` (str.isdigit accepts it, int() refuses it) in a run folder: every command's
    start-up recovery passes over it."""
    from framework_bench.run import pipeline
    from framework_bench.store.results import ResultStore
    run_dir = pipeline.runs_root() / "20261203-000000-tiny_cpu-torch-000001"
    run_dir.mkdir(parents=True)
    (run_dir / "host.json.\u00b2").write_text("{}")
    with ResultStore(tmp_path / "r.sqlite") as store:
        assert pipeline.recover(store) == []


@pytest.mark.parametrize("command", [["show"], ["validate"], ["run", "--backend", "torch", "--scenario"],
                                     ["compare", "--backends", "torch", "--scenario"]])
def test_a_scenario_name_longer_than_a_file_name_is_one_line(tmp_path, fbench_home, command):
    """No file can be named so (255 bytes at most): the name is looked up, not a traceback on its stat."""
    one_error(cli(*command, "s" * 300, "--db", str(tmp_path / "r.sqlite")) if command[0] in ("run", "compare")
              else cli(*command, "s" * 300), "s" * 40)
    assert not (tmp_path / "r.sqlite").exists() or ResultStore(tmp_path / "r.sqlite").list() == []


def _store_with_one_compare(db: Path) -> str:
    with ResultStore(db) as store:
        for round_ in (1, 2):
            store.add(RunResult(backend="fake_ok", scenario="tiny_cpu", status="ok", tgs=100.0 + round_,
                                compare_id="20260101-000000-abcd", trial_round=round_, trial_position=1),
                      scenario.load("tiny_cpu"), manifest_={})
    return "20260101-000000-abcd"


@pytest.mark.parametrize("second", ["whole", "a start of it"])
def test_diff_of_a_compare_against_itself_is_refused(tmp_path, fbench_home, second):
    db = tmp_path / "r.sqlite"
    compare_id = _store_with_one_compare(db)
    other = compare_id if second == "whole" else compare_id[:10]
    one_error(cli("diff", compare_id, other, "--db", str(db)), compare_id, "itself")


@pytest.mark.parametrize("command", [["diff"], ["results", "list"], ["results", "export"], ["results", "show", "1"],
                                     ["report"], ["plot"]])
def test_a_zero_byte_results_file_is_one_line_naming_it(tmp_path, fbench_home, command):
    db = tmp_path / "empty.sqlite"
    db.touch()
    one_error(cli(*command, "--db", str(db)), str(db), "empty")
    assert db.read_bytes() == b""  # a reading command writes nothing into it


def test_a_relative_fbench_home_is_the_folder_it_names_from_where_the_command_was_typed(fakes, tmp_path, monkeypatch):
    """The worker starts in its run folder: a run folder under a relative FBENCH_HOME was not found from there."""
    from framework_bench.scenario import places
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FBENCH_HOME", "rel")
    assert places.state_dir() == tmp_path / "rel"
    monkeypatch.chdir("/")
    assert places.state_dir() == tmp_path / "rel"  # decided once, wherever the process goes after
    monkeypatch.chdir(tmp_path)
    res = cli("compare", "--scenario", "tiny_cpu", "--backends", "fake_ok")
    assert res.exit_code == 0, res.output
    [row] = ResultStore(tmp_path / "rel" / "results" / "results.sqlite").list()
    assert row["status"] == "ok" and Path(row["run_dir"]).is_relative_to(tmp_path / "rel" / "runs")
