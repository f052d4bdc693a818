"""Many sequences in one KV cache: cells and masks against a plain Python model of them, and
batches of several sequences against each sequence evaluated alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("gguf")

from polydev.errors import ContextFullError, InvalidArgumentError  # noqa: E402
from polydev.models import Batch, load  # noqa: E402
from polydev.models.batch import UBatch, padded_size  # noqa: E402
from polydev.models.evaluator import Evaluator  # noqa: E402
from polydev.models.kv_cells import KVCells  # noqa: E402

from model_files import write_test_model  # noqa: E402
from needs import opencl_devices, opencl_mark  # noqa: E402


def tokens_for(n: int, seed: int, n_vocab: int = 320) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


# --- cells against a dictionary of cell -> (position, sequences) -----------------------------

class NaiveCells:
    def __init__(self, size: int) -> None:
        self.size, self.cells, self.shift = size, {}, {}

    def place(self, n, positions, seqs):
        free = [i for i in range(self.size) if i not in self.cells][:n]
        for cell, pos, seq in zip(free, positions, seqs):
            self.cells[cell] = (pos, {seq})
            self.shift.pop(cell, None)        # a new token's key has nothing to turn
        return free

    def seq_rm(self, seq, p0, p1):
        for cell, (pos, owners) in list(self.cells.items()):
            if pos >= p0 and (p1 < 0 or pos < p1):
                owners.discard(seq) if seq >= 0 else owners.clear()
                if not owners:
                    del self.cells[cell]

    def seq_cp(self, src, dst, p0, p1):
        for pos, owners in self.cells.values():
            if src in owners and pos >= p0 and (p1 < 0 or pos < p1):
                owners.add(dst)

    def seq_keep(self, seq):
        for cell, (pos, owners) in list(self.cells.items()):
            if seq in owners:
                self.cells[cell] = (pos, {seq})
            else:
                del self.cells[cell]

    def seq_add(self, seq, p0, p1, delta):
        """False (nothing moved) where a moving cell is shared."""
        moving = [cell for cell, (pos, owners) in self.cells.items()
                  if seq in owners and pos >= p0 and (p1 < 0 or pos < p1)]
        if any(self.cells[cell][1] != {seq} for cell in moving):
            return False
        for cell in moving:
            pos, owners = self.cells[cell]
            if pos + delta < 0:
                del self.cells[cell]
            else:
                self.cells[cell] = (pos + delta, owners)
                self.shift[cell] = self.shift.get(cell, 0) + delta
        return True

    def has_shift(self):
        return any(self.shift.get(cell, 0) for cell in self.cells)

    def allowed(self, pos, seq, n_kv, window):
        return [i in self.cells and seq in self.cells[i][1] and self.cells[i][0] <= pos
                and (not window or self.cells[i][0] > pos - window) for i in range(n_kv)]


operations = st.lists(st.one_of(
    st.tuples(st.just("place"), st.integers(1, 6), st.integers(0, 3)),
    st.tuples(st.just("rm"), st.integers(-1, 3), st.integers(0, 8), st.integers(-1, 12)),
    st.tuples(st.just("cp"), st.integers(0, 3), st.integers(0, 3), st.integers(0, 8)),
    st.tuples(st.just("keep"), st.integers(0, 3)),
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 8), st.integers(-1, 12),
              st.integers(-6, 6)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("take_shift")),
), max_size=25)


@settings(max_examples=150, deadline=None)
@given(operations, st.integers(0, 5))
# a cell moved below position 0 is emptied, and its pending shift with it
@example([("place", 1, 0), ("place", 1, 0), ("add", 0, 0, 1, -1)], 0)
def test_cells_and_masks_follow_the_sequences(ops_, window):
    size = 24
    cells, naive = KVCells(size), NaiveCells(size)
    for op in ops_:
        if op[0] == "place":
            _, n, seq = op
            start = cells.seq_pos_max(seq) + 1
            positions = np.arange(start, start + n, dtype=np.int32)
            found = cells.find(n)
            if found is None:
                assert size - len(naive.cells) < n
                continue
            assert found.tolist() == naive.place(n, positions.tolist(), [seq] * n)
            cells.assign(found, positions, np.full(n, seq, np.int32))
        elif op[0] == "rm":
            cells.seq_rm(*op[1:])
            naive.seq_rm(*op[1:])
        elif op[0] == "cp":
            cells.seq_cp(op[1], op[2], 0, op[3])
            naive.seq_cp(op[1], op[2], 0, op[3])
        elif op[0] == "add":
            if naive.seq_add(*op[1:]):
                cells.seq_add(*op[1:])
            else:
                with pytest.raises(InvalidArgumentError, match="cannot move"):
                    cells.seq_add(*op[1:])
        elif op[0] == "clear":
            cells.clear()
            naive.cells.clear()
        elif op[0] == "take_shift":
            cells.take_shift()
            naive.shift.clear()
        else:
            cells.seq_keep(op[1])
            naive.seq_keep(op[1])
        assert cells.used == len(naive.cells)
        assert cells.has_shift == naive.has_shift()
        assert cells.end == (max(naive.cells) + 1 if naive.cells else 0)
        for seq in range(4):
            mine = [p for p, owners in naive.cells.values() if seq in owners]
            assert cells.seq_pos_max(seq) == (max(mine) if mine else -1)
    positions = np.array([0, 3, 7, 7], dtype=np.int32)
    seqs = np.array([0, 1, 2, 3], dtype=np.int32)
    mask = cells.mask(positions, seqs, size, window, np.empty((4, size), np.float16))
    for row, pos, seq in zip(mask, positions, seqs):
        assert (row == 0).tolist() == naive.allowed(int(pos), int(seq), size, window)
        one = cells.mask(np.array([pos]), np.array([seq]), size, window,   # a decode step's
                         np.empty((1, size), np.float16))
        assert (one[0] == 0).tolist() == naive.allowed(int(pos), int(seq), size, window)
        assert set(one[0].tolist()) <= {0.0, -np.inf}


def test_a_decode_steps_ubatch_is_as_any_other():
    """One token's UBatch (its numbers made as one array) holds what the general path's
    would, as int32, and pads and splits as any other."""
    ub = UBatch.of_sequence([42], 17, 5)
    general = UBatch.of_sequence([42, 43], 17, 5).split(1)[0]
    for got, want in zip((ub.tokens, ub.positions, ub.seq_ids, ub.outputs),
                         (general.tokens, general.positions, general.seq_ids, [0])):
        assert got.dtype == np.int32 and got.tolist() == list(want)
    padded = ub.padded(3)
    assert (padded.tokens.tolist(), padded.positions.tolist(), padded.seq_ids.tolist(),
            padded.outputs.tolist()) == ([42] * 3, [17] * 3, [5] * 3, [0])
    assert ub.split(4) == [ub]


def test_sequence_ids_are_checked():
    cells = KVCells(8)
    with pytest.raises(InvalidArgumentError, match="sequence id 64"):
        cells.seq_rm(64)
    with pytest.raises(InvalidArgumentError, match="sequence id -2"):
        cells.seq_cp(-2, 1)


# --- batches of sequences against each sequence alone -----------------------------------------

MODELS = {
    "llama": dict(arch="llama", n_layer=2, head_dim=32),
    "gemma3": dict(arch="gemma3", head_dim=32, sliding_window=4, n_layer=3),
    "qwen3moe": dict(arch="qwen3moe", n_expert=4, head_dim=32, n_layer=2),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "m.gguf"
    return write_test_model(path, weight_type="F16", **MODELS[request.param])


def alone(path, ids: list[int], steps: list[int] = ()) -> np.ndarray:
    """Every position's logits of ``ids`` then ``steps`` one at a time, in a fresh model."""
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        m.eval(ids, all_logits=True)
        rows = [m.logits()]
        for t in steps:
            m.eval([t])
            rows.append(m.logits()[None])
    return np.concatenate(rows)


def close(got, want):
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max())


def test_sequences_in_one_batch_equal_each_alone(model_file):
    """Three prompts in one batch, interleaved token by token, then decode steps of all three
    in one batch: each sequence's logits are those it has alone (masks keep them apart)."""
    prompts = [tokens_for(n, seed) for n, seed in ((5, 1), (9, 2), (3, 3))]
    steps = [tokens_for(3, seed) for seed in (4, 5, 6)]
    with load(model_file, devices=[], n_ctx=256, progress=False) as m:
        batch = Batch()
        for i in range(max(map(len, prompts))):
            for seq, p in enumerate(prompts):
                if i < len(p):
                    batch.add(p[i], seq, logits=True)
        rows = m.decode(batch)
        got = [[rows[j] for j, s in enumerate(batch.seq_ids) if s == seq] for seq in range(3)]
        for i in range(3):
            step = Batch()
            for seq in (2, 0, 1):
                step.add(steps[seq][i], seq, logits=True)
            for seq, row in zip((2, 0, 1), m.decode(step)):
                got[seq].append(row)
    for seq in range(3):
        close(np.stack(got[seq]), alone(model_file, prompts[seq], steps[seq]))


@opencl_mark()
def test_sequences_over_opencl_and_the_cpu(tmp_path):
    """Layers split over OpenCL0 and the CPU (cache cells on both): a batch of three sequences
    gives the CPU's logits, and continuous batching the CPU's greedy tokens."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=3, weight_type="F16")
    prompts = [tokens_for(n, seed) for n, seed in ((6, 1), (11, 2), (4, 3))]
    batch = Batch()
    for seq, p in enumerate(prompts):
        batch.add_sequence(p, seq, logits="all")
    results = {}
    for name, devices in (("cpu", []), ("split", opencl_devices(1))):
        with load(path, devices=devices, n_gpu_layers=2, n_ctx=256, progress=False) as m:
            results[name] = (m.decode(batch), m.generate_batch(prompts, 8, temperature=0))
    close(results["split"][0], results["cpu"][0])
    assert results["split"][1] == results["cpu"][1]


def test_a_shared_prefix_is_stored_once(model_file):
    """seq_cp shares a prompt's cells with two more sequences; each continues differently in
    one batch, and holds the logits of its whole text evaluated alone."""
    prefix = tokens_for(20, 7)
    tails = [tokens_for(n, 8 + n) for n in (4, 6, 2)]
    with load(model_file, devices=[], n_ctx=256, progress=False) as m:
        m.eval(prefix)
        for seq in (1, 2):
            m.memory.seq_cp(0, seq)
        assert m.memory.cells.used == 20
        batch = Batch()
        for seq, tail in enumerate(tails):
            batch.add_sequence(tail, seq, logits="all")
        rows = m.decode(batch)
        assert m.memory.cells.used == 20 + sum(map(len, tails))
        assert [m.memory.seq_pos_max(s) for s in range(3)] == [23, 25, 21]
    first = 0
    for seq, tail in enumerate(tails):
        want = alone(model_file, prefix + tail)[20:]
        close(rows[first:first + len(tail)], want)
        first += len(tail)


def test_freed_cells_are_reused(tmp_path):
    """A sequence removed with seq_rm leaves holes that the next sequence fills; seq_keep
    drops the others; the logits stay those of each sequence alone."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=2, weight_type="F16")
    a, b, c = tokens_for(10, 1), tokens_for(12, 2), tokens_for(8, 3)
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        m.decode(Batch().add_sequence(a, 0).add_sequence(b, 1))
        m.memory.seq_rm(0)
        assert m.memory.cells.used == 12
        rows = m.decode(Batch().add_sequence(c, 2, logits="all"))
        assert m.memory.cells.end == 22           # c went into a's cells
        close(rows, alone(path, c))
        m.memory.seq_rm(1, 6)                      # b keeps its first six tokens
        rows = m.decode(Batch().add_sequence(b[6:], 1, logits="all"))
        close(rows, alone(path, b)[6:])
        m.memory.seq_keep(2)
        assert m.memory.cells.used == 8 and m.memory.seq_pos_max(1) == -1


# --- prompt steps padded to recurring shapes --------------------------------------------------

@given(st.integers(1, 4096), st.integers(1, 4096))
def test_padded_sizes_are_few_and_waste_little(n, limit):
    """At least the tokens, at most the limit unless the tokens pass it; from 64 tokens on at
    most an eighth more; 35 shapes up to 512 tokens."""
    size = padded_size(n, limit)
    assert size >= n and (size <= limit or size == n)
    assert n < 64 or size - n <= n / 8
    assert padded_size(size, limit) == size
    assert len({padded_size(k, 512) for k in range(1, 513)}) == 35


def holes_then_prompts(path, prompts, steps, pad: bool, monkeypatch):
    """Logits of two prompts in one batch put in a hole of the cache (a removed sequence's
    cells, below one that stays), then decode steps of both; and the cells they hold."""
    with monkeypatch.context() as mp:
        if not pad:
            mp.setattr(Evaluator, "_padded", lambda self, ub: ub)
        with load(path, devices=[], n_ctx=256, progress=False) as m:
            m.decode(Batch().add_sequence(tokens_for(40, 9), 3))
            m.decode(Batch().add_sequence(tokens_for(5, 10), 2))
            m.memory.seq_rm(3)
            batch = Batch().add_sequence(prompts[0], 0).add_sequence(prompts[1], 1)
            rows = [m.decode(batch)]
            shape = m.evaluator._last_graph.shape.n_tokens
            for a, b in zip(*steps):
                rows.append(m.decode(Batch().add(a, 0, logits=True).add(b, 1, logits=True)))
            rows.append(m.decode(Batch().add(7, 2, logits=True)))
            held = np.flatnonzero(m.memory.cells.pos >= 0)
    return np.concatenate(rows), shape, held


def test_a_padded_prompt_step_gives_the_logits_of_its_own_shape(model_file, monkeypatch):
    """Prompts of 21 and 12 tokens in one batch run as a step of 40 rows whose padding takes
    free cells of a hole in the cache: the logits of the prompts, of decode steps after them
    and of the sequence beyond the hole are those of a step of exactly 33 rows, and the
    padding holds no cell."""
    prompts = [tokens_for(21, 1), tokens_for(12, 2)]
    steps = [tokens_for(3, 3), tokens_for(3, 4)]
    got, padded_rows, held = holes_then_prompts(model_file, prompts, steps, True, monkeypatch)
    want, rows, want_held = holes_then_prompts(model_file, prompts, steps, False, monkeypatch)
    assert (padded_rows, rows) == (40, 33)
    np.testing.assert_array_equal(held, want_held)
    assert held.size == 5 + 33 + 2 * 3 + 1
    close(got, want)


def test_prompts_of_nearby_lengths_share_one_graph(tmp_path):
    """Prompts of 17 to 24 tokens build one graph; a step that outputs every row (a decode
    batch, all logits) and one with no free cells for its padding keep their own shapes."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=1)
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        ev = m.evaluator
        m.eval(tokens_for(17, 1))
        built = ev.timings.graphs_built
        for n in range(18, 25):
            m.reset()
            m.eval(tokens_for(n, n))
            assert ev._last_graph.shape.n_tokens == 24
        assert ev.timings.graphs_built == built
        m.reset()
        m.eval(tokens_for(21, 5), all_logits=True)
        assert ev._last_graph.shape.n_tokens == 21
        m.reset()
        m.eval(tokens_for(10, 6))
        m.eval(tokens_for(243, 7))                  # 253 of 256 cells: no room for 256
        assert ev._last_graph.shape.n_tokens == 243
        assert m.memory.cells.used == 253


def test_a_prompt_attends_over_a_few_recurring_counts_of_cells(tmp_path):
    """With 2100 cells in use a prompt's step attends over 2560 (a multiple of 512, the
    masked rest skipped), a decode step over 2304 (of 256), and both give the logits of the
    whole text evaluated at once."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=2, weight_type="F16")
    text = tokens_for(2120, 11)
    with load(path, devices=[], n_ctx=4096, progress=False) as m:
        m.eval(text[:2100])
        prompt = m.evaluator.eval(text[2100:2119])
        assert m.evaluator._last_graph.shape.n_kv == 2560
        decode = m.evaluator.eval(text[2119:])
        assert m.evaluator._last_graph.shape.n_kv == 2304
    with load(path, devices=[], n_ctx=4096, progress=False) as m:
        m.eval(text, all_logits=True)
        rows = m.logits()
    close(np.stack([prompt, decode]), rows[[2118, 2119]])


def test_bad_batches_leave_nothing_cached(tmp_path, monkeypatch):
    path = write_test_model(tmp_path / "m.gguf", n_layer=1)
    with load(path, devices=[], n_ctx=256, n_batch=4, progress=False) as m:
        m.decode(Batch().add_sequence(tokens_for(5, 1), 0).add_sequence(tokens_for(3, 2), 1))
        cells = m.memory.cells
        with pytest.raises(InvalidArgumentError, match="at position 9 of sequence 1, which "
                                                       "continues at position 3"):
            m.decode(Batch().add(1, 0).add(2, 1, pos=9))
        with pytest.raises(InvalidArgumentError, match="sequence id 64"):
            m.decode(Batch().add(1, 64))
        with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
            m.decode(Batch().add(1, 0).add(320, 1))
        with pytest.raises(ContextFullError, match="8 are cached and 249 more do not fit"):
            m.decode(Batch().add_sequence(tokens_for(249, 3), 2))
        assert cells.used == 8

        calls = []

        def failing_compute(graph):
            calls.append(graph)
            if len(calls) == 2:
                raise InvalidArgumentError("a kernel failed")
        monkeypatch.setattr(m.evaluator.sched, "compute_async", failing_compute)
        with pytest.raises(InvalidArgumentError, match="a kernel failed"):
            m.decode(Batch().add_sequence(tokens_for(6, 4), 0).add_sequence([1, 2], 3))
        assert len(calls) == 2 and cells.used == 8          # the first piece was undone
        assert [m.memory.seq_pos_max(s) for s in range(4)] == [4, 2, -1, -1]


# --- continuous batching -----------------------------------------------------------------------

from polydev.models.engine import BatchEngine, Finished, Piece, QueueFullError  # noqa: E402
from polydev.models.sampling import SamplingParams  # noqa: E402
from polydev.models.stop_strings import StopMatcher  # noqa: E402


@pytest.mark.parametrize("pieces, stops, shown, stopped", [
    (["Hello", " wor", "ld"], ["world"], "Hello ", True),
    (["a<", "/s", ">b"], ["</s>"], "a", True),
    (["a<", "b"], ["</s>"], "a<b", False),
    (["x", "y"], [], "xy", False),
    (["ab", "cd"], ["bc", "d"], "a", True),               # the earliest stop wins
])
def test_stop_strings_hold_back_what_may_begin_one(pieces, stops, shown, stopped):
    matcher, out, hit = StopMatcher(stops), "", False
    for piece in pieces:
        text, hit = matcher.feed(piece)
        out += text
        if hit:
            break
    if not hit:
        out += matcher.flush()
    assert (out, hit) == (shown, stopped)


def generate_alone(path, prompt, n, **kw) -> list[int]:
    with load(path, devices=[], n_ctx=256, progress=False, **kw) as m:
        list(m.generate(prompt, n, temperature=0))
        return m.generated


@pytest.fixture(scope="module")
def engine_model(tmp_path_factory):
    return write_test_model(tmp_path_factory.mktemp("engine") / "m.gguf", n_layer=2,
                            weight_type="F16")


def test_greedy_requests_together_give_what_each_gives_alone(engine_model):
    """Seven prompts of different lengths over three slots with 8-token batches: requests
    wait, long prompts are read in chunks while the others decode, and every greedy request
    yields the tokens it yields alone."""
    prompts = [tokens_for(n, seed) for seed, n in enumerate((3, 20, 7, 12, 1, 30, 5))]
    with load(engine_model, devices=[], n_ctx=256, n_batch=8, progress=False) as m:
        engine = BatchEngine(m, n_slots=3)
        tokens, ends = {}, {}
        for i, p in enumerate(prompts):
            def on_event(event, i=i):
                if isinstance(event, Piece):
                    tokens.setdefault(i, []).extend(event.tokens)
                else:
                    ends[i] = event
            engine.submit(p, on_event, max_tokens=6 + i, params=SamplingParams(temperature=0))
        assert engine.queued == 7
        steps = 0
        while engine.step():
            steps += 1
            assert engine.processing <= 3
        assert engine.processing == engine.queued == 0
    for i, p in enumerate(prompts):
        want = generate_alone(engine_model, p, 6 + i)
        assert tokens.get(i, []) == want, i
        assert ends[i].reason == ("length" if len(want) == 6 + i else "stop")
        assert ends[i].prompt_tokens == len(p) and ends[i].completion_tokens == len(want)
    assert steps < sum(6 + i for i in range(7)) + 10     # decoded together, not one by one


def test_generate_batch_and_sampling_per_request(engine_model):
    prompts = [tokens_for(n, seed) for seed, n in enumerate((4, 9, 2))]
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        texts = m.generate_batch(prompts, 5, temperature=0)
        for p, text in zip(prompts, texts):
            assert text == "".join(m.generate(p, 5, temperature=0))
        seeded = [m.generate_batch(prompts, 8, temperature=1.0, seed=3) for _ in range(2)]
        assert seeded[0] == seeded[1]


def test_a_cached_prefix_is_reused_and_shared(engine_model):
    """A request that continues an ended one reads only its new tokens (same slot); one that
    shares a long prefix with a busy slot's cache shares those cells, and both generate what
    they generate alone."""
    history = tokens_for(40, 11)
    greedy = SamplingParams(temperature=0)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        engine = BatchEngine(m, n_slots=2)
        ends, texts = {}, {}

        def submit(name, prompt, n):
            def on_event(event):
                if isinstance(event, Finished):
                    ends[name] = event
                else:
                    texts[name] = texts.get(name, "") + event.text
            engine.submit(prompt, on_event, max_tokens=n, params=greedy)

        submit("first", history, 2)
        engine.run_until_done()
        submit("next turn", history + [5, 6, 7], 12)
        engine.step()                                  # reads its 3 new tokens
        assert ends.get("next turn") is None and m.memory.cells.used == 43
        submit("branch", history[:30] + [9, 9, 9], 4)  # the other slot, empty
        engine.step()
        assert m.memory.cells.used == 43 + 1 + 3       # the branch's 30 cells are shared
        engine.run_until_done()
        assert ends["next turn"].cached_tokens == 40 and ends["branch"].cached_tokens == 30
        assert texts.get("branch", "") == "".join(m.generate(history[:30] + [9, 9, 9], 4,
                                                             temperature=0))


def test_stops_lengths_cancellation_and_a_full_queue(engine_model):
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        want = "".join(m.generate(tokens_for(6, 1), 12, temperature=0))
        stop = want[3:5]
        engine = BatchEngine(m, n_slots=2, max_queued=0)
        got, ends = [], []

        def on_event(event):
            (got if isinstance(event, Piece) else ends).append(event)

        engine.submit(tokens_for(6, 1), on_event, max_tokens=12, stops=[stop],
                      params=SamplingParams(temperature=0))
        engine.submit(tokens_for(6, 1), lambda e: None, max_tokens=0)
        with pytest.raises(QueueFullError):
            engine.submit([1], lambda e: None)
        engine.run_until_done()
        assert "".join(p.text for p in got) == want[:want.index(stop)]
        assert ends[0].reason == "stop"

        cancelled = []
        handle = engine.submit(tokens_for(6, 2), cancelled.append, max_tokens=50)
        engine.step()
        handle.cancel()
        engine.run_until_done()
        assert isinstance(cancelled[-1], Finished) and cancelled[-1].reason == "cancelled"
        assert engine.processing == 0
        with pytest.raises(ContextFullError, match="the prompt has 256 tokens"):
            engine.submit(tokens_for(256, 3), lambda e: None)


def test_generate_is_the_engine_with_one_sequence(engine_model):
    """Model.generate ends at stop strings as the engine does, and a generation left early
    (the consumer stops reading) frees its sequence: the context keeps what was evaluated,
    and the next generation starts from it as from any cached prefix."""
    ids = tokens_for(10, 21)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        want = "".join(m.generate(ids, 12, temperature=0))
        stop = want[4:6]
        stopped = "".join(m.generate(ids, 12, temperature=0, stop=[stop]))
        assert stopped == want[:want.index(stop)]
        pieces = m.generate(ids, 12, temperature=0)
        next(pieces)
        pieces.close()
        assert m.tokens[:10] == ids and m.memory.seq_pos_max(0) + 1 == len(m.tokens)
        assert "".join(m.generate(ids, 12, temperature=0)) == want


def test_a_generation_left_open_ends_where_the_next_begins(engine_model):
    """A generator that is neither finished nor closed does not hold sequence 0: the next
    generate ends it (resuming it then finds it ended) and starts from what it left."""
    ids = tokens_for(10, 24)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        want = "".join(m.generate(ids, 10, temperature=0))
        left_open = m.generate(ids, 10, temperature=0)
        next(left_open)
        assert "".join(m.generate(ids, 10, temperature=0)) == want
        assert list(left_open) == []
        assert m.memory.seq_pos_max(0) + 1 == len(m.tokens) > len(ids)


def test_no_tokens_asked_reads_the_prompt_and_a_stop_string_is_whole(engine_model):
    ids = tokens_for(10, 25)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        assert list(m.generate(ids, 0)) == [] and m.generated == []
        assert m.tokens == ids and m.memory.seq_pos_max(0) + 1 == len(ids)
        want = "".join(m.generate(ids, 12, temperature=0))
        stop = want[3:6]                    # a string of three characters, not three stops
        stopped = "".join(m.generate(ids, 12, temperature=0, stop=stop))
        assert stopped == want[:want.index(stop)]


def test_an_interrupted_generation_leaves_the_context_whole(engine_model, monkeypatch):
    """Ctrl-C inside a step (polydev run) rolls the step back: the context is what the cache
    holds, and generating again gives what it gave before."""
    ids = tokens_for(10, 22)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        want = "".join(m.generate(ids, 8, temperature=0))
        decode, calls = m.evaluator.decode, []

        def interrupted(batch):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return decode(batch)
        monkeypatch.setattr(m.evaluator, "decode", interrupted)
        with pytest.raises(KeyboardInterrupt):
            list(m.generate(tokens_for(6, 23), 8, temperature=0))
        assert m.memory.seq_pos_max(0) + 1 == len(m.tokens) > 6
        assert "".join(m.generate(ids, 8, temperature=0)) == want


def test_the_snapshot_shows_slots_queue_and_cache(engine_model):
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        engine = BatchEngine(m, n_slots=2)
        for seed in range(3):
            engine.submit(tokens_for(5, seed), lambda e: None, max_tokens=4,
                          params=SamplingParams(temperature=0))
        before = engine.snapshot()
        assert (before.queued, before.processing, before.kv_cells_used) == (3, 0, 0)
        engine.step()
        now = engine.snapshot()
        assert now.queued == 1 and now.processing == 2 and now.kv_cells_size == m.n_ctx
        assert [s.n_cached for s in now.slots] == [5, 5] and now.kv_cells_used == 10
        assert now.prompt_tokens == 10 and all(s.processing for s in now.slots)
        engine.run_until_done()
        done = engine.snapshot()
        assert done.processing == done.queued == 0 and done.generated_tokens >= 3


def test_a_full_context_ends_the_longest_sequence(tmp_path):
    path = write_test_model(tmp_path / "m.gguf", n_layer=1, weight_type="F16")
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        engine = BatchEngine(m, n_slots=2)
        ends = {}
        for i, n in enumerate((150, 60)):
            engine.submit(tokens_for(n, i), lambda e, i=i: ends.setdefault(i, e)
                          if isinstance(e, Finished) else None, max_tokens=200,
                          params=SamplingParams(temperature=1.0, seed=i, top_k=0,
                                                min_p=0.0))
        engine.run_until_done()
        assert m.memory.cells.used <= 256
        assert ends[0].reason == "length" and ends[0].completion_tokens < 200


def test_a_failed_batch_ends_its_requests_and_the_engine_goes_on(engine_model, monkeypatch):
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        engine = BatchEngine(m, n_slots=2)
        ends = []
        decode = m.evaluator.decode      # the engine's way in (its slots keep the tokens)

        def failing(batch):
            raise InvalidArgumentError("a kernel failed")
        monkeypatch.setattr(m.evaluator, "decode", failing)
        for seed in (1, 2):
            engine.submit(tokens_for(5, seed), lambda e: ends.append(e)
                          if isinstance(e, Finished) else None, max_tokens=4)
        engine.step()
        assert [e.reason for e in ends] == ["error", "error"]
        assert "a kernel failed" in str(ends[0].error) and engine.processing == 0
        monkeypatch.setattr(m.evaluator, "decode", decode)
        engine.submit(tokens_for(5, 3), lambda e: ends.append(e)
                      if isinstance(e, Finished) else None, max_tokens=4)
        engine.run_until_done()
        assert ends[-1].reason in ("stop", "length") and m.memory.cells.used > 0


@pytest.mark.parametrize("cache", ["f32", "f16", "q8_0"])
def test_moved_positions_turn_the_cached_keys(model_file, cache):
    """seq_add moves a whole sequence 10 positions on: RoPE makes attention depend on
    relative positions only, so the next tokens' logits are those of the unmoved sequence
    (the keys turned in the cache's own type)."""
    ids, tail = tokens_for(24, 21), tokens_for(3, 22)
    tolerance = {"f32": 1e-4, "f16": 5e-3, "q8_0": 3e-2}[cache]
    with load(model_file, devices=[], n_ctx=256, type_k=cache, type_v=cache,
              progress=False) as m:
        m.eval(ids + tail, all_logits=True)
        want = m.logits()[len(ids):]
        m.reset()
        m.eval(ids)
        m.memory.seq_add(0, 0, -1, 10)
        assert m.memory.seq_pos_max(0) == 33
        got = m.decode(Batch().add_sequence(tail, 0, logits="all"))
        assert not m.memory.cells.has_shift
    np.testing.assert_allclose(got, want, atol=tolerance * np.abs(want).max())


def test_a_context_shift_drops_a_span_and_moves_the_rest(tmp_path):
    """llama.cpp's context shift: drop positions 5-11 and move the rest back by 7. With one
    layer the cached keys and values of the tokens left depend on nothing that was dropped,
    so the next tokens' logits are those of a fresh evaluation of the text that is left."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=1, weight_type="F16")
    ids, tail = tokens_for(24, 23), tokens_for(3, 24)
    kept = ids[:5] + ids[12:]
    with load(path, devices=[], n_ctx=256, type_k="f32", type_v="f32", progress=False) as m:
        m.eval(kept + tail, all_logits=True)
        want = m.logits()[len(kept):]
        m.reset()
        m.eval(ids)
        m.memory.seq_rm(0, 5, 12)
        m.memory.seq_add(0, 12, -1, -7)
        got = m.decode(Batch().add_sequence(tail, 0, logits="all"))
    close(got, want)


def test_shared_cells_do_not_move():
    cells = KVCells(8)
    cells.assign(np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int32),
                 np.zeros(4, np.int32))
    cells.seq_cp(0, 1, 0, 2)
    with pytest.raises(InvalidArgumentError, match="shares cells"):
        cells.seq_add(0, 0, -1, 3)
    assert cells.pos[:4].tolist() == [0, 1, 2, 3] and not cells.has_shift
    cells.seq_add(0, 2, -1, -3)                    # positions 2, 3 -> -1 (dropped), 0
    assert cells.pos[:4].tolist() == [0, 1, -1, 0] and cells.shift[3] == -3


def test_generate_after_the_memory_was_edited_starts_over(engine_model):
    """Model.tokens cannot follow seq_rm/seq_add made through memory: generate then
    evaluates its prompt afresh instead of trusting a cache that no longer matches."""
    ids = tokens_for(20, 31)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        want = "".join(m.generate(ids, 6, temperature=0))
        m.memory.seq_rm(0, 5, 12)
        m.memory.seq_add(0, 12, -1, -7)
        assert "".join(m.generate(ids, 6, temperature=0)) == want
        assert m.tokens[:20] == ids


def test_a_request_whose_sampling_fails_ends_alone(engine_model, monkeypatch):
    from polydev.models.sampling import Sampler

    sample, calls = Sampler.sample, []

    def first_fails(self, logits):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("probabilities contain NaN")
        return sample(self, logits)
    monkeypatch.setattr(Sampler, "sample", first_fails)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        engine, ends = BatchEngine(m, n_slots=2), {}
        for i in range(2):
            engine.submit(tokens_for(5, i), lambda e, i=i: ends.setdefault(i, e)
                          if isinstance(e, Finished) else None, max_tokens=3)
        engine.run_until_done()
    assert sorted(e.reason for e in ends.values())[0] == "error"
    assert {e.reason for e in ends.values()} - {"error"} <= {"stop", "length"}
    assert sum(e.reason == "error" for e in ends.values()) == 1


def test_requests_with_one_prompt_share_its_cells(engine_model):
    """Three requests of one 40-token prompt submitted together (``n`` choices): one reads
    the prompt, the others wait for it and share its cells, and each generates what it
    generates alone."""
    prompt = tokens_for(40, 21)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        engine = BatchEngine(m, n_slots=3)
        ends, tokens = {}, {}
        for i in range(3):
            def on_event(event, i=i):
                if isinstance(event, Piece):
                    tokens.setdefault(i, []).extend(event.tokens)
                else:
                    ends[i] = event
            engine.submit(prompt, on_event, max_tokens=4, params=SamplingParams(temperature=0))
        engine.step()
        assert engine.processing == 1 and m.memory.cells.used == 40
        engine.run_until_done()
    assert sorted(e.cached_tokens for e in ends.values()) == [0, 39, 39]
    assert tokens[0] == tokens[1] == tokens[2] == generate_alone(engine_model, prompt, 4)


def test_a_saved_slot_restores_into_the_same_model_only(engine_model, tmp_path):
    from polydev.models.engine import SlotBusyError

    prompt = tokens_for(30, 5)
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        engine = BatchEngine(m, n_slots=2)
        engine.submit(prompt, lambda e: None, max_tokens=3, params=SamplingParams(temperature=0))
        engine.run_until_done()
        held = engine.cached(0)
        assert engine.save_slot(0, tmp_path / "s.bin")[0] == len(held)
        engine.erase_slot(0)
        assert engine.restore_slot(1, tmp_path / "s.bin")[0] == len(held)   # another slot
        assert engine.cached(1) == held and m.memory.cells.used == len(held)
        tokens = []
        engine.submit(held + [7], lambda e: tokens.extend(getattr(e, "tokens", ())),
                      max_tokens=3, params=SamplingParams(temperature=0))
        engine.step()
        with pytest.raises(SlotBusyError, match="slot 1 is serving"):
            engine.save_slot(1, tmp_path / "busy.bin")
        engine.run_until_done()
    assert tokens == generate_alone(engine_model, held + [7], 3)
    (tmp_path / "bad.bin").write_bytes((tmp_path / "s.bin").read_bytes()[:-4])
    with load(engine_model, devices=[], n_ctx=256, progress=False) as m:
        engine = BatchEngine(m, n_slots=2)
        with pytest.raises(InvalidArgumentError, match="holds no tokens"):
            engine.save_slot(0, tmp_path / "empty.bin")
        engine.restore_slot(0, tmp_path / "s.bin")
        with pytest.raises(InvalidArgumentError, match="damaged"):
            engine.restore_slot(0, tmp_path / "bad.bin")
        assert engine.cached(0) == held and m.memory.cells.used == len(held)   # kept
    other = write_test_model(tmp_path / "wide.gguf", n_layer=2, n_embd=128, weight_type="F16")
    with load(other, devices=[], n_ctx=256, progress=False) as m:
        with pytest.raises(InvalidArgumentError, match="another model or cache"):
            BatchEngine(m, n_slots=1).restore_slot(0, tmp_path / "s.bin")
        assert m.memory.cells.used == 0
