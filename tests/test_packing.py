"""Packed Alpaca: row lengths, labels, document boundaries, determinism, hash stability, repeat.

The expected stream is rebuilt here independently (record -> template -> tokenizer.encode),
then compared with what `fbench`'s packer wrote to disk.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from framework_bench.worker import packed
from framework_bench.scenario import scenario
from framework_bench.data import alpaca, packing, tokenizer
from framework_bench.scenario import catalog
from framework_bench.worker.packed import IGNORE_INDEX, PackedRows
from framework_bench.scenario.scenario import Scenario

BOS, EOS = 1, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny_cpu packed once into a private FBENCH_HOME (shared by the read-only tests here)."""
    home = tmp_path_factory.mktemp("fbench_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FBENCH_HOME", str(home))
        s = scenario.load("tiny_cpu")
        data = packing.pack(s, progress=False, say=lambda m: None)
    assert data.dir.is_relative_to(home)
    return s, data, PackedRows(data.dir)


@pytest.fixture(scope="module")
def records(tiny):
    s = tiny[0]
    return [r for src in catalog.sources(s.dataset) for r in alpaca.load_source(src)[0]]


@pytest.fixture(scope="module")
def expected_stream(records):
    """<s> prompt response </s> per record, labels -100 over <s> + prompt: built without the packer."""
    tok = tokenizer.builtin_bytes()
    ids, labels, starts, prompt_lens = [], [], [], []
    for rec in records:
        prompt, response = alpaca.format_record(rec)
        p = tok.encode(prompt, add_special_tokens=False).ids
        r = tok.encode(response, add_special_tokens=False).ids
        starts.append(len(ids))
        prompt_lens.append(len(p))
        ids += [BOS] + p + r + [EOS]
        labels += [IGNORE_INDEX] * (1 + len(p)) + r + [EOS]
    return np.array(ids, np.int32), np.array(labels, np.int32), np.array(starts), np.array(prompt_lens)


def test_rows_exactly_context_length(tiny):
    s, data, rows = tiny
    m = data.manifest
    assert rows.input_ids.shape == rows.labels.shape == (m["rows"], s.context_length)
    assert rows.input_ids.dtype == rows.labels.dtype == np.int32
    assert m["context_length"] == rows.context_length == 512
    assert m["tokens"] == m["rows"] * 512
    assert m["rows"] >= s.rows_needed
    assert m["dropped_tail_tokens"] == m["repeat"] * m["base_tokens"] - m["tokens"]
    assert 0 <= m["dropped_tail_tokens"] < 512


def test_stream_equals_independent_rebuild(tiny, expected_stream):
    _, data, rows = tiny
    ids, labels, _, _ = expected_stream
    assert data.manifest["base_tokens"] == ids.size
    n = data.manifest["tokens"]
    assert data.manifest["repeat"] == 1 and n <= ids.size
    np.testing.assert_array_equal(np.asarray(rows.input_ids).reshape(-1), ids[:n])
    np.testing.assert_array_equal(np.asarray(rows.labels).reshape(-1), labels[:n])


def test_labels_masked_exactly_over_bos_and_prompt(tiny, expected_stream):
    _, data, rows = tiny
    _, _, starts, prompt_lens = expected_stream
    flat_ids = np.asarray(rows.input_ids).reshape(-1)
    flat_lab = np.asarray(rows.labels).reshape(-1)
    doc_starts = np.asarray(rows.doc_starts)
    ends = np.append(doc_starts[1:], flat_ids.size)
    for k, (lo, hi) in enumerate(zip(doc_starts, ends)):
        lab, ids = flat_lab[lo:hi], flat_ids[lo:hi]
        masked = 1 + prompt_lens[k]
        assert (lab[:masked] == IGNORE_INDEX).all(), k
        assert (lab[masked:] == ids[masked:]).all(), k  # response + </s> carry loss
        assert (lab[masked:] != IGNORE_INDEX).all(), k
    assert data.manifest["label_tokens"] == int(np.count_nonzero(flat_lab != IGNORE_INDEX))


def test_documents_decode_to_template(tiny, records):
    """One document with an input and one without decode to the template text and their response."""
    _, _, rows = tiny
    tok = tokenizer.builtin_bytes()
    flat_ids = np.asarray(rows.input_ids).reshape(-1)
    flat_lab = np.asarray(rows.labels).reshape(-1)
    starts = np.asarray(rows.doc_starts)
    checked = set()
    for k, rec in enumerate(records[: len(starts) - 1]):
        kind = bool(rec.get("input"))
        if kind in checked:
            continue
        lo, hi = starts[k], starts[k + 1]
        ids, lab = flat_ids[lo:hi].tolist(), flat_lab[lo:hi]
        n_prompt = int(np.argmax(lab != IGNORE_INDEX))
        assert ids[0] == BOS and ids[-1] == EOS
        if kind:
            prompt = ("Below is an instruction that describes a task, paired with an input that provides further "
                      "context. Write a response that appropriately completes the request.\n\n"
                      f"### Instruction:\n{rec['instruction']}\n\n### Input:\n{rec['input']}\n\n### Response:\n")
        else:
            prompt = ("Below is an instruction that describes a task. "
                      "Write a response that appropriately completes the request.\n\n"
                      f"### Instruction:\n{rec['instruction']}\n\n### Response:\n")
        assert tok.decode(ids[1:n_prompt]) == prompt
        assert tok.decode(ids[n_prompt:-1]) == rec["output"]
        checked.add(kind)
    assert checked == {True, False}


def test_chinese_document_round_trips(tiny, records):
    _, _, rows = tiny
    tok = tokenizer.builtin_bytes()
    starts = np.asarray(rows.doc_starts)
    k = next(i for i, r in enumerate(records) if any("\u4e00" <= c <= "\u9fff" for c in r["output"]))
    flat = np.asarray(rows.input_ids).reshape(-1)
    doc = flat[starts[k]: starts[k + 1]].tolist()
    assert tok.decode(doc).endswith(records[k]["output"])


def test_doc_starts_consistent_with_stream(tiny, expected_stream):
    _, data, rows = tiny
    flat = np.asarray(rows.input_ids).reshape(-1)
    starts = np.asarray(rows.doc_starts)
    assert starts.dtype == np.int64
    assert starts[0] == 0 and (np.diff(starts) > 0).all() and starts[-1] < flat.size
    assert (flat[starts] == BOS).all()
    # the byte tokenizer emits id 1 only as <s>: every BOS is a document start and vice versa
    np.testing.assert_array_equal(np.flatnonzero(flat == BOS), starts)
    assert (flat[starts[1:] - 1] == EOS).all()
    exp_starts = expected_stream[2]
    np.testing.assert_array_equal(starts, exp_starts[exp_starts < flat.size])
    assert data.manifest["documents"] == starts.size
    assert data.manifest["base_documents"] == exp_starts.size


@pytest.mark.parametrize("row", [0, 1, 7, -1])
def test_segment_ids_and_cu_seqlens_follow_doc_starts(tiny, row):
    _, _, rows = tiny
    ctx = rows.context_length
    row = row % rows.rows
    lo = row * ctx
    starts = np.asarray(rows.doc_starts)
    seg = rows.segment_ids(row)
    cu = rows.cu_seqlens(row)
    assert seg.shape == (ctx,) and seg[0] == 1
    # position j belongs to 1 + the number of documents starting in (lo, lo + j]
    expected = 1 + np.searchsorted(starts, lo + np.arange(ctx), side="right") - np.searchsorted(starts, lo, side="right")
    np.testing.assert_array_equal(seg, expected)
    inside = starts[(starts > lo) & (starts < lo + ctx)] - lo
    np.testing.assert_array_equal(cu, np.concatenate([[0], inside, [ctx]]))
    assert cu.dtype == np.int32 and seg.max() == cu.size - 1
    # every segment after the first starts with <s>
    ids = np.asarray(rows.input_ids[row])
    assert (ids[cu[1:-1]] == BOS).all()


def test_segment_ids_when_a_document_starts_the_row(tiny):
    _, _, rows = tiny
    ctx = rows.context_length
    starts = np.asarray(rows.doc_starts)
    aligned = starts[(starts % ctx == 0)]
    row = int(aligned[0] // ctx)  # row 0 at least
    assert rows.segment_ids(row)[0] == 1
    assert rows.cu_seqlens(row)[0] == 0 and rows.cu_seqlens(row)[1] > 0


def test_hash_covers_shapes_ids_labels_and_doc_starts(tiny):
    _, data, rows = tiny
    h = hashlib.sha256(str(tuple(rows.input_ids.shape)).encode())
    h.update(np.ascontiguousarray(rows.input_ids, dtype="<i4").tobytes())
    h.update(str(tuple(rows.labels.shape)).encode())
    h.update(np.ascontiguousarray(rows.labels, dtype="<i4").tobytes())
    h.update(str(tuple(rows.doc_starts.shape)).encode())
    h.update(np.ascontiguousarray(rows.doc_starts, dtype="<i8").tobytes())
    raw = h.hexdigest()
    assert data.sha256 == rows.sha256() == packed.stream_sha256(rows.input_ids, rows.labels, rows.doc_starts) == raw
    assert json.loads((data.dir / packed.MANIFEST).read_text())["sha256"] == raw


def test_tokenizer_saved_with_packed_data(tiny):
    _, data, rows = tiny
    assert (rows.tokenizer_dir / "tokenizer.json").is_file()
    cfg = json.loads((rows.tokenizer_dir / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == "<s>" and cfg["eos_token"] == "</s>" and cfg["model_max_length"] == 512
    assert data.manifest["tokenizer"]["vocab_size"] == 259


def test_deterministic_across_homes_and_cached(tiny, fbench_home):
    s, first, _ = tiny
    again = packing.pack(scenario.load("tiny_cpu"), progress=False, say=lambda m: None)
    assert again.dir.is_relative_to(fbench_home) and not again.cached
    assert again.sha256 == first.sha256
    assert again.dir.name == first.dir.name  # same cache key from the same inputs
    hit = packing.pack(scenario.load("tiny_cpu"), progress=False, say=lambda m: None)
    assert hit.cached and hit.dir == again.dir and hit.sha256 == first.sha256


def test_hash_changes_with_context_length(tiny, fbench_home):
    s, first, _ = tiny
    other = scenario.Scenario.model_validate({**s.model_dump(), "context_length": 1000})
    data = packing.pack(other, progress=False, say=lambda m: None)
    assert data.manifest["context_length"] == 1000
    assert data.sha256 != first.sha256
    assert data.dir != first.dir
    assert data.sha256 == PackedRows(data.dir).sha256()


def test_hash_distinguishes_row_length_with_same_tokens(tiny, fbench_home):
    s, first, _ = tiny
    other = scenario.Scenario.model_validate({**s.model_dump(), "context_length": 1024})
    data = packing.pack(other, progress=False, say=lambda m: None)
    assert data.manifest["tokens"] == first.manifest["tokens"]  # the premise: same tokens, other rows
    assert data.sha256 != first.sha256


def small_scenario(alpaca_dir, **overrides) -> Scenario:
    """tiny-llama on the Chinese demo file only (715k byte tokens)."""
    data = {
        "name": "repeat_probe",
        "model": {"preset": "tiny-llama"},
        "cluster": {"device": "cpu"},
        "context_length": 4096,
        "steps": {"warmup": 0, "measured": 200},
        "dataset": {"sources": [{"path": str(alpaca_dir / "alpaca_zh_demo.json")}]},
    }
    for k, v in overrides.items():
        data[k] = v
    return Scenario.model_validate(data)


def test_repeat_when_dataset_too_small(alpaca_dir, fbench_home):
    s = small_scenario(alpaca_dir)
    said = []
    data = packing.pack(s, progress=False, say=said.append)
    m = data.manifest
    base = m["base_tokens"]
    assert s.rows_needed * s.context_length > base  # the premise: one copy is not enough
    assert m["repeat"] == 2 and m["repeat_requested"] == 1
    assert m["rows"] >= s.rows_needed
    assert m["tokens"] == m["rows"] * 4096 == (2 * base // 4096) * 4096
    assert said and "repeated 2x" in said[0]
    rows = PackedRows(data.dir)
    flat = np.asarray(rows.input_ids).reshape(-1)
    lab = np.asarray(rows.labels).reshape(-1)
    tail = m["tokens"] - base
    np.testing.assert_array_equal(flat[base:], flat[:tail])  # the second copy starts over
    np.testing.assert_array_equal(lab[base:], lab[:tail])
    starts = np.asarray(rows.doc_starts)
    assert base in set(starts.tolist())
    assert m["documents"] == starts.size == int(np.count_nonzero(flat == BOS))
    first_copy = starts[starts < base]
    np.testing.assert_array_equal(starts[starts >= base] - base, first_copy[: starts.size - first_copy.size])


def test_requested_repeat_is_honoured(alpaca_dir, fbench_home):
    s = small_scenario(alpaca_dir, steps={"warmup": 0, "measured": 1},
                       dataset={"sources": [{"path": str(alpaca_dir / "alpaca_zh_demo.json")}], "repeat": 3})
    said = []
    m = packing.pack(s, progress=False, say=said.append).manifest
    assert m["repeat"] == m["repeat_requested"] == 3
    assert m["tokens"] == (3 * m["base_tokens"] // 4096) * 4096
    assert not said  # nothing raised beyond what was asked


def test_repeats_needed():
    assert packing.repeats_needed(1000, 3, 500, 1) == 2
    assert packing.repeats_needed(1000, 2, 500, 1) == 1
    assert packing.repeats_needed(1000, 1, 500, 6) == 6
    assert packing.repeats_needed(1000, 21, 1000, 1) == 21


def test_pack_stream_vectorised_on_synthetic_stream(tmp_path):
    """pack_stream on a hand-made stream: copies, cut, document starts across copies."""
    lengths = np.array([3, 5, 2], np.int64)
    ids = np.arange(10, dtype=np.int32) + 10
    labels = np.where(np.arange(10) % 2 == 0, IGNORE_INDEX, ids).astype(np.int32)
    counts = packing.pack_stream(packing.Stream(ids, labels, lengths), 4, 3, tmp_path)
    assert counts["rows"] == 7 and counts["tokens"] == 28 and counts["dropped_tail_tokens"] == 2
    out = np.load(tmp_path / packed.INPUT_IDS)
    np.testing.assert_array_equal(out.reshape(-1), np.tile(ids, 3)[:28])
    np.testing.assert_array_equal(np.load(tmp_path / packed.LABELS).reshape(-1), np.tile(labels, 3)[:28])
    np.testing.assert_array_equal(np.load(tmp_path / packed.DOC_STARTS), [0, 3, 8, 10, 13, 18, 20, 23])
    assert counts["documents"] == 8


def test_vocab_overflow_is_a_data_error(alpaca_dir, fbench_home):
    arch = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
            "intermediate_size": 128, "vocab_size": 100, "rope_theta": 10000.0, "max_position_embeddings": 4096}
    s = small_scenario(alpaca_dir, model={"config": arch})
    with pytest.raises(alpaca.DataError, match="vocab_size 100"):
        packing.pack(s, progress=False, say=lambda m: None)
