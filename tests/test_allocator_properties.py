"""Stateful property test: random interleavings of admit / decode / fork / free / prefix reuse /
exhaustion. After every step the design's invariants hold, and every live sequence reads back,
through its block table from the real pool, exactly the K/V written for it."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lab.memory.block_pool import PoolExhausted
from lab.serving.synthetic_kv import SyntheticKV
from tests.engine_helpers import decode, make_manager, prefill, same

SYSTEM_PROMPTS = [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23, 24, 25]]
prompts = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from([[]] + SYSTEM_PROMPTS),
    st.lists(st.integers(0, 40), min_size=1, max_size=9),
)


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m = make_manager(num_blocks=12, block_size=3, num_layers=2)
        self.kv = SyntheticKV(self.m.config, seed=0)
        self.expected: dict[int, list[int]] = {}  # seq id -> the tokens we wrote

    def _state(self):
        b = self.m.blocks
        return (list(b.ref_counts), b.free_queue(), {h: list(ids) for h, ids in b.cached.items()},
                {i: (list(s.tokens), list(s.block_table)) for i, s in self.m.sequences.items()})

    @rule(prompt=prompts)
    def admit(self, prompt):
        before = self._state()
        try:
            sid = prefill(self.m, self.kv, prompt)
        except PoolExhausted:
            assert self._state() == before  # a failed admission changes nothing
            return
        self.expected[sid] = list(prompt)

    @precondition(lambda self: self.expected)
    @rule(data=st.data(), token=st.integers(0, 40))
    def decode(self, data, token):
        sid = data.draw(st.sampled_from(sorted(self.expected)))
        before = self._state()
        try:
            decode(self.m, self.kv, sid, token)
        except PoolExhausted:
            assert self._state() == before
            return
        self.expected[sid].append(token)

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def fork(self, data):
        sid = data.draw(st.sampled_from(sorted(self.expected)))
        child = self.m.fork(sid).seq_id
        self.expected[child] = list(self.expected[sid])

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.expected)))
        self.m.free(sid)
        del self.expected[sid]

    @invariant()
    def invariants_hold(self):
        self.m.check_invariants()
        assert set(self.m.sequences) == set(self.expected)

    @invariant()
    def every_sequence_reads_back_its_own_kv(self):
        for sid, tokens in self.expected.items():
            want_k, want_v = self.kv.keys_values(tokens, 0)  # [L, n, kv_heads, D]
            for layer in range(self.m.config.num_layers):
                k, v = self.m.read_kv(sid, layer)
                assert same(k, want_k[layer]), f"seq {sid} layer {layer} keys"
                assert same(v, want_v[layer]), f"seq {sid} layer {layer} values"


AllocatorMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50,
                                              deadline=None)
test_allocator_state_machine = AllocatorMachine.TestCase
