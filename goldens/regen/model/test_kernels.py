"""Hand-computed checks of ds41_kernels.py (MODEL.md §5). Run from the repository root:
    python3 -m unittest discover -s goldens/regen/model -v
"""
import math
import sys
import unittest
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds41_kernels as K  # noqa: E402


def bf16(values):
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)


class Pow2Ceil(unittest.TestCase):
    def test_powers_and_neighbours(self):
        t = torch.tensor([1.0, 1.5, 0.75, 0.125, 3.0, 2.0**-20, np.nextafter(np.float32(2.0), np.float32(0))], dtype=torch.float32)
        self.assertEqual(K.pow2ceil(t).tolist(), [1.0, 2.0, 1.0, 0.125, 4.0, 2.0**-20, 2.0])

    def test_refuses_zero(self):
        with self.assertRaises(ValueError):
            K.pow2ceil(torch.tensor([0.0]))


class ActQuant(unittest.TestCase):
    def test_exact_block_round_trips(self):
        # amax 3.5 -> 3.5/448 = 2^-7 exactly -> s = 2^-7; every value is representable.
        x = bf16([1.0] * 31 + [3.5])
        q, s = K.act_quant(x.clone(), 32)
        self.assertEqual(s.tolist(), [2.0**-7])
        self.assertEqual(q.float().tolist(), [128.0] * 31 + [448.0])
        y = K.act_quant(x.clone(), 32, inplace=True)
        self.assertTrue(torch.equal(y, x))

    def test_rounding_and_tie_to_even(self):
        # amax 1 -> 1/448 -> pow2ceil = 2^-8; 0.3·256 = 76.8 -> 80 (spacing 8 in [64,128));
        # 76/256 -> 76 is a tie between 72 (odd mantissa) and 80 (even) -> 80.
        x = bf16([1.0, 0.3, 76.0 / 256, 0.0] + [0.0] * 28)
        y = K.act_quant(x.clone(), 32, inplace=True).float().tolist()
        self.assertEqual(y[:4], [1.0, 0.3125, 0.3125, 0.0])

    def test_all_zero_block_uses_floor(self):
        q, s = K.act_quant(torch.zeros(32, dtype=torch.bfloat16), 32)
        self.assertEqual(s.item(), K.pow2ceil(torch.tensor([1e-4 / 448])).item())
        self.assertTrue((q.float() == 0).all())


class Fp4ActQuant(unittest.TestCase):
    MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.3, -0.0]
    EXPECTED = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 0.5, 0.0]

    def test_e8m0_ties_to_even_code(self):
        vals = self.MIDPOINTS + [6.0] + [0.0] * (32 - len(self.MIDPOINTS) - 1)
        y = K.fp4_act_quant(bf16(vals), 32, inplace=True).float().tolist()
        self.assertEqual(y[:len(self.EXPECTED)], self.EXPECTED)
        self.assertEqual(y[len(self.MIDPOINTS)], 6.0)

    def test_e4m3_scale_and_division(self):
        # amax 7 -> 7/6 = 1.1667 -> e4m3 1.125 (spacing 1/8); 7/1.125 = 6.22 -> clamp 6 -> 6.75;
        # 1.0/1.125 = 0.889 -> 1.0 -> 1.125.
        y = K.fp4_act_quant(bf16([7.0, 1.0] + [0.0] * 14), 16, inplace=True,
                            scale_dtype=torch.float8_e4m3fn).float().tolist()
        self.assertEqual(y[:3], [6.75, 1.125, 0.0])

    def test_packed_output_nibbles(self):
        packed, s = K.fp4_act_quant(bf16([1.0, -6.0] + [0.0] * 30), 32)
        self.assertEqual(s.float().tolist(), [1.0])
        # code(1.0) = 2 in the low nibble, code(-6) = 8|7 = 15 in the high nibble
        self.assertEqual(packed.view(torch.uint8)[0].item(), 2 | (15 << 4))


def e4m3_random(shape, gen):
    raw = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
    vals = raw.view(torch.float8_e4m3fn)
    return torch.where(torch.isnan(vals.float()), torch.zeros(shape), vals.float()).to(torch.float8_e4m3fn)


class BlockGemm(unittest.TestCase):
    def test_hand_computed(self):
        # block 0: 32 × (1 · 0.5) = 16, × sa 1 × sw 2 = 32; block 1: 32 × (2 · 0.5) = 32,
        # × sa 0.5 × sw 4 = 64; total 96.
        a = torch.tensor([1.0] * 32 + [2.0] * 32).to(torch.float8_e4m3fn).view(1, 64)
        b = torch.full((1, 64), 0.5).to(torch.float8_e4m3fn)
        y = K.fp8_gemm(a, torch.tensor([[1.0, 0.5]]), b, torch.tensor([[2.0, 4.0]]))
        self.assertEqual(y.float().tolist(), [[96.0]])

    def test_matches_exact_rational_reference_and_is_m_independent(self):
        gen = torch.Generator().manual_seed(7)
        m, n, k = 3, 40, 96
        a = e4m3_random((m, k), gen)
        b = e4m3_random((n, k), gen)
        sa = torch.pow(2.0, torch.randint(-8, 3, (m, k // 32), generator=gen).float())
        sw = torch.pow(2.0, torch.randint(-8, 3, ((n + 31) // 32, k // 32), generator=gen).float())
        torch.set_default_dtype(torch.bfloat16)
        try:
            y = K.fp8_gemm(a, sa, b, sw)
            rows = torch.cat([K.fp8_gemm(a[i:i + 1], sa[i:i + 1], b, sw) for i in range(m)])
        finally:
            torch.set_default_dtype(torch.float32)
        self.assertTrue(torch.equal(y, rows), "result depends on M")
        av, bv = a.float().tolist(), b.float().tolist()
        for i in range(m):
            for j in range(n):
                acc = np.float32(0.0)
                for blk in range(k // 32):
                    exact = sum(Fraction(av[i][t]) * Fraction(bv[j][t]) for t in range(blk * 32, blk * 32 + 32))
                    term = np.float32(float(exact)) * np.float32(sa[i, blk]) * np.float32(sw[j // 32, blk])
                    acc = np.float32(acc + term)
                want = torch.tensor(float(acc)).to(torch.bfloat16).float().item()
                self.assertEqual(y[i, j].float().item(), want, (i, j))

    def test_fp4_gemm_unpacks_low_nibble_first(self):
        # weight row: codes 2 (1.0) then 15 (-6.0), repeated; activations all 1 -> per block
        # 16 × (1 - 6) = -80, × sw 0.5 -> -40 per block, 2 blocks -> -80.
        packed = torch.full((1, 32), 2 | (15 << 4), dtype=torch.uint8)
        a = torch.ones(1, 64).to(torch.float8_e4m3fn)
        y = K.fp4_gemm(a, torch.ones(1, 2), packed, torch.tensor([[0.5, 0.5]]))
        self.assertEqual(y.float().tolist(), [[-80.0]])


class SparseAttn(unittest.TestCase):
    def reference(self, q, kv, sink, idx, scale):
        out = np.zeros(q.shape[-1])
        valid = [i for i in idx if i >= 0]
        if not valid:
            return out
        s = [float(np.dot(q, kv[i])) * scale for i in valid]
        mx = max(s)
        w = [math.exp(v - mx) for v in s]
        den = sum(w) + math.exp(sink - mx)
        return sum(wi * kv[i] for wi, i in zip(w, valid)) / den

    def test_two_keys_with_sink(self):
        kv = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.bfloat16)
        q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.bfloat16)
        out = K.sparse_attn(q, kv, torch.tensor([0.0]), torch.tensor([[[0, 1, -1]]]), 1.0)
        # scores 1 and 0, max M = 1, sink 0: out = (e^0·[1,0] + e^-1·[0,1]) / (e^0 + e^-1 + e^-1)
        e = math.e
        want = [e / (e + 2), 1 / (e + 2)]
        self.assertAlmostEqual(out[0, 0, 0, 0].float().item(), want[0], delta=4e-3)
        self.assertAlmostEqual(out[0, 0, 0, 1].float().item(), want[1], delta=4e-3)

    def test_probabilities_are_rounded_to_bf16_before_pv(self):
        # kv0 = [1, 0] scores c·scale, kv1 = [0, 1] scores 0; negligible sink. Then
        # out[1] = bf16(p1) / (1 + p1) with p1 = exp(-c·scale) — pick a scale where rounding p1
        # to bf16 first changes the bf16 output, and require the kernel to do exactly that.
        def bf(x):
            return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())
        kv = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.bfloat16)
        q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.bfloat16)
        for i in range(1, 400):
            scale = i / 397
            p1 = float(torch.exp(torch.tensor(-scale, dtype=torch.float32)))
            den = float(torch.tensor(1.0) + torch.tensor(p1, dtype=torch.float32))
            with_rounding = bf(bf(p1) / den)
            without = bf(p1 / den)
            if with_rounding != without:
                break
        else:
            self.fail("no distinguishing scale found")
        out = K.sparse_attn(q, kv, torch.tensor([-1e4]), torch.tensor([[[0, 1]]]), scale)
        self.assertEqual(out[0, 0, 0, 1].float().item(), with_rounding)

    def test_no_valid_index_and_huge_sink_give_zero(self):
        kv = torch.ones(1, 3, 4, dtype=torch.bfloat16)
        q = torch.ones(1, 1, 2, 4, dtype=torch.bfloat16)
        out = K.sparse_attn(q, kv, torch.tensor([0.0, 0.0]), torch.tensor([[[-1, -1]]]), 0.5)
        self.assertTrue((out == 0).all())
        out = K.sparse_attn(q, kv, torch.tensor([200.0, 0.0]), torch.tensor([[[0, 1]]]), 0.5)
        self.assertEqual(out[0, 0, 0].float().abs().max().item(), 0.0)
        self.assertGreater(out[0, 0, 1].float().abs().max().item(), 0.0)

    def test_long_list_against_float64_reference_and_layout_sensitivity(self):
        gen = torch.Generator().manual_seed(3)
        kv = torch.randn(1, 150, 16, generator=gen).to(torch.bfloat16)
        q = torch.randn(1, 1, 2, 16, generator=gen).to(torch.bfloat16)
        sink = torch.tensor([0.3, -1.0])
        idx = list(range(0, 150, 2))
        front = torch.tensor([[[-1] * 10 + idx]])
        back = torch.tensor([[idx + [-1] * 10]])
        a = K.sparse_attn(q, kv, sink, front, 0.25)
        b = K.sparse_attn(q, kv, sink, back, 0.25)
        for h in range(2):
            want = self.reference(q[0, 0, h].double().numpy(), kv[0].double().numpy(), sink[h].item(), idx, 0.25)
            np.testing.assert_allclose(a[0, 0, h].double().numpy(), want, atol=2e-2, rtol=2e-2)
            np.testing.assert_allclose(b[0, 0, h].double().numpy(), want, atol=2e-2, rtol=2e-2)


class HcSplitSinkhorn(unittest.TestCase):
    def test_zero_mixes_give_uniform_doubly_stochastic(self):
        pre, post, comb = K.hc_split_sinkhorn(torch.zeros(1, 24), torch.ones(3), torch.zeros(24))
        self.assertTrue(torch.allclose(pre, torch.full((1, 4), 0.5 + 1e-6)))
        self.assertTrue(torch.equal(post, torch.ones(1, 4)))
        self.assertTrue(torch.allclose(comb, torch.full((1, 4, 4), 0.25), atol=1e-6))

    def test_random_mixes_converge_and_follow_the_formulas(self):
        gen = torch.Generator().manual_seed(1)
        m = torch.randn(5, 24, generator=gen)
        scale = torch.tensor([0.7, 1.3, 2.0])
        base = torch.randn(24, generator=gen)
        pre, post, comb = K.hc_split_sinkhorn(m, scale, base)
        self.assertTrue(torch.equal(pre, (1 / (1 + torch.exp(-(m[:, :4] * scale[0] + base[:4])))) + torch.tensor(1e-6)))
        self.assertTrue(torch.equal(post, 2 * (1 / (1 + torch.exp(-(m[:, 4:8] * scale[1] + base[4:8]))))))
        self.assertTrue(torch.allclose(comb.sum(-2), torch.ones(5, 4), atol=1e-5))   # columns
        # Rows are only approximately normalised (the loop ends on a column step), but each
        # iteration brings them closer.
        two_iters = K.hc_split_sinkhorn(m, scale, base, sinkhorn_iters=2)[2]
        row_err = (comb.sum(-1) - 1).abs().max()
        self.assertLess(row_err, (two_iters.sum(-1) - 1).abs().max())
        self.assertLess(row_err, 0.05)

    def test_rejects_non_f32(self):
        with self.assertRaises(ValueError):
            K.hc_split_sinkhorn(torch.zeros(1, 24, dtype=torch.bfloat16), torch.ones(3), torch.zeros(24))


class StableTopk(unittest.TestCase):
    def test_ties_go_to_lower_index(self):
        x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
        v, i = K.stable_topk(x, 2)
        self.assertEqual(i.tolist(), [[1, 2], [0, 1]])
        self.assertEqual(v.tolist(), [[3.0, 3.0], [0.0, 0.0]])
        _, i = K.stable_topk(torch.tensor([float("-inf"), 1.0, float("-inf"), float("inf")]), 3)
        self.assertEqual(i.tolist(), [3, 1, 0])

    def test_smallest_and_nan(self):
        _, i = K.stable_topk(torch.tensor([2.0, 1.0, 1.0]), 2, largest=False)
        self.assertEqual(i.tolist(), [1, 2])
        with self.assertRaises(ValueError):
            K.stable_topk(torch.tensor([1.0, float("nan")]), 1)

    def test_margin(self):
        m = K.selection_margin(torch.tensor([[4.0, 2.0, 1.0], [3.0, 3.0, 1.0]]), 1)
        self.assertEqual(m.tolist(), [0.5, 0.0])


if __name__ == "__main__":
    unittest.main()
