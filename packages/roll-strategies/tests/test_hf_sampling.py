"""hf_infer's seeded sampling: the counter-based per-row streams and the inverse-CDF draw of SeededRowSampler."""

from __future__ import annotations

import math
import random

import pytest
import torch

from roll.strategies.hf._sampling import SeededRowSampler, seed_stream_keys, stream_uniforms

MASK = 2**64 - 1


def splitmix64_finalizer(x: int) -> int:
    """The reference: splitmix64's finalizer on unsigned 64-bit Python ints."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def reference_uniform(seed: int, step: int) -> float:
    key = splitmix64_finalizer(seed & MASK)
    return (splitmix64_finalizer((key + (step + 1) * 0x9E3779B97F4A7C15) & MASK) >> 11) * 2.0**-53


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_stream_uniforms_equal_the_unsigned_reference_bit_for_bit_on_every_device(device):
    # Integer hashing only: any device that wraps int64 multiplication computes these exact floats.
    seeds = [0, 1, 2, 7, 12345, 2**31 - 1, 2**62 + 3, 2**63 - 1, 2**63, 2**64 - 1, 2**64 + 5]
    keys = seed_stream_keys(seeds).to(device)
    for step in [0, 1, 2, 63, 10_000]:
        got = stream_uniforms(keys, step)
        assert got.dtype == torch.float64 and got.device.type == device
        assert got.cpu().tolist() == [reference_uniform(seed, step) for seed in seeds]


def test_stream_uniforms_are_uniform_and_distinct_across_seeds_and_steps():
    keys = seed_stream_keys(range(2000))
    draws = torch.stack([stream_uniforms(keys, step) for step in range(50)])  # (steps, seeds)
    assert float(draws.min()) >= 0.0 and float(draws.max()) < 1.0
    assert draws.unique().numel() == draws.numel()  # no two (seed, step) pairs share a draw
    # 100,000 draws: mean 1/2 and variance 1/12 within a few standard errors, every tenth of [0, 1) near 10%.
    assert abs(float(draws.mean()) - 0.5) < 0.005
    assert abs(float(draws.var()) - 1 / 12) < 0.002
    torch.testing.assert_close(torch.histc(draws.float(), bins=10, min=0, max=1) / draws.numel(),
                               torch.full((10,), 0.1), atol=0.005, rtol=0)  # fmt: skip
    # Neighbouring seeds (sample j of a prompt draws with seed + j) are uncorrelated.
    assert abs(float(torch.corrcoef(torch.stack([draws[:, :-1].flatten(), draws[:, 1:].flatten()]))[0, 1])) < 0.02


def row_logits(seed: int, vocab: int) -> torch.Tensor:
    """A distribution of its own for every seed, so a row is recognisable wherever the batch puts it."""
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_a_rows_tokens_depend_on_its_seed_alone_not_on_its_batch_or_position():
    seeds, vocab, steps = [11, 5, 42, 7, 1000, 3], 300, 40
    order = [4, 0, 5, 2, 1, 3]
    logits = torch.stack([row_logits(s, vocab) for s in seeds])

    def tokens(rows: list[int]) -> dict[int, list[int]]:
        sampler = SeededRowSampler([seeds[r] for r in rows])
        drawn = [sampler(None, logits[rows]).argmax(dim=-1).tolist() for _ in range(steps)]
        return {r: [step[i] for step in drawn] for i, r in enumerate(rows)}

    alone = {r: tokens([r])[r] for r in range(len(seeds))}
    assert tokens(list(range(len(seeds)))) == alone
    assert tokens(order) == alone
    assert tokens(order[:2]) | tokens(order[2:]) == alone
    # Different seeds draw different sequences from the same distribution.
    same = SeededRowSampler([8, 9])
    pairs = [same(None, logits[:1].expand(2, -1)).argmax(dim=-1).tolist() for _ in range(steps)]
    assert sum(a != b for a, b in pairs) > steps // 2


def test_masked_tokens_are_never_drawn_and_a_single_kept_token_always_is():
    logits = torch.randn(64, 50)
    logits[:, ::2] = float("-inf")  # top-k / top-p / min-p leave -inf outside the kept set
    logits[0, :] = float("-inf")
    logits[0, 17] = 3.0
    sampler = SeededRowSampler(range(64))
    for _ in range(30):
        out = sampler(None, logits)
        assert bool((out.isinf().sum(dim=-1) == 49).all()) and bool((out.max(dim=-1).values == 0).all())
        drawn = out.argmax(dim=-1)
        assert bool((drawn % 2 == 1).all()) and int(drawn[0]) == 17


def test_a_large_vocabularys_tail_tokens_are_drawn_exactly():
    # One head token and 150,000 tail tokens of weight 0.9 * 2**-24 each (0.8% of the mass together). Past the head
    # the cdf is 1 + k * weight, which float32 can only hold to 2**-23, the width of two tail tokens: a float32 cdf
    # would miss the drawn token by up to two. Rows whose first uniform falls in the tail must draw its exact token.
    vocab = 150_001
    logits = torch.full((vocab,), math.log(0.9 * 2.0**-24))
    logits[0] = 0.0
    weight = float(torch.exp(logits[1:2]))
    total = 1 + (vocab - 1) * weight
    candidates = list(range(20_000))
    firsts = dict(zip(candidates, stream_uniforms(seed_stream_keys(candidates), 0).tolist()))
    # token k (>= 1) holds the targets in [1 + (k - 1) * weight, 1 + k * weight); keep off the boundaries
    position = {s: (u * total - 1.0) / weight + 1 for s, u in firsts.items() if u * total > 1.0}
    tail_seeds = [s for s, x in position.items() if 0.01 < x % 1 < 0.99][:12]
    head_seeds = [s for s, u in firsts.items() if u * total < 0.99][:4]
    seeds = tail_seeds + head_seeds
    drawn = SeededRowSampler(seeds)(None, logits.expand(len(seeds), -1)).argmax(dim=-1).tolist()
    assert drawn == [int(position[s]) for s in tail_seeds] + [0] * len(head_seeds)


def test_the_draw_is_the_inverse_cdf_of_the_rows_uniform():
    probs = torch.tensor([0.1, 0.25, 0.0, 0.4, 0.25])
    seeds = random.Random(0).sample(range(2**40), 200)
    out = SeededRowSampler(seeds)(None, probs.log().expand(len(seeds), -1))
    uniforms = stream_uniforms(seed_stream_keys(seeds), 0)
    expected = torch.searchsorted(probs.double().cumsum(dim=0), uniforms, right=True)
    assert out.argmax(dim=-1).tolist() == expected.tolist()


def test_seed_count_must_match_the_rows():
    with pytest.raises(ValueError, match="2 seeds for 3 rows"):
        SeededRowSampler([1, 2])(None, torch.zeros((3, 10)))
