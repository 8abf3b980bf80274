//! The vector kernels of `model::simd` against what they must equal: the AVX2, AVX-512 and
//! VNNI C1 block sums against the exact sums, the AVX-512 C2 chains against the portable
//! chains, on every e4m3 code and e2m1 nibble (and every bf16 pattern for rows read in
//! place). On a CPU without the instructions a kernel cannot run: its trials are reported
//! ignored with that reason, never passed (the portable copies run there, and the linear tests
//! cover them).

use libtest_mimic::{Arguments, Failed, Trial};

fn main() {
    let args = Arguments::from_args();
    // A trial whose instructions (or build) are missing is reported ignored with the reason.
    let gated =
        |name: &'static str, run: fn() -> Result<(), Failed>, missing: Option<&'static str>| {
            let trial = Trial::test(name, run);
            match missing {
                Some(why) => trial.with_ignored_flag(true).with_kind(why),
                None => trial,
            }
        };
    let trials = vec![
        gated(
            "vector_block_sums_equal_the_exact_sum_on_every_code",
            x86::block_sums,
            x86::missing(),
        ),
        gated(
            "each_e4m3_code_and_e2m1_nibble_alone_gives_its_value",
            x86::single_codes,
            x86::missing(),
        ),
        gated(
            "vector_block_decoders_equal_the_tables_on_every_code",
            x86::tile_decoders,
            x86::missing(),
        ),
        gated(
            "avx512_block_decoders_equal_the_tables_on_every_code",
            x86::avx512_tile_decoders,
            x86::missing_avx512(),
        ),
        gated(
            "avx512_eight_row_block_sums_equal_the_exact_sums_on_every_code",
            x86::eight_row_blocks,
            x86::missing_avx512(),
        ),
        gated(
            "avx512_c1_loops_equal_their_block_steps_and_stop_at_the_blocks_they_leave",
            x86::c1_loops,
            x86::missing_avx512(),
        ),
        gated(
            "avx512_c2_loops_equal_their_block_steps_and_stop_at_the_blocks_they_leave",
            x86::c2_loop,
            x86::missing_avx512(),
        ),
        gated(
            "vq_loops_equal_the_definition_in_every_index_format",
            x86::vq_loops,
            x86::missing(),
        ),
        gated(
            "vnni_nibble_loop_equals_its_block_steps_and_stops_at_the_blocks_it_leaves",
            x86::vnni_fp4_loop,
            x86::missing_vnni(),
        ),
        gated(
            "avx2_integer_loops_equal_the_exact_sums_and_stop_at_the_blocks_they_leave",
            x86::avx2_digit_loop,
            x86::missing(),
        ),
        gated(
            "avx2_scale_readers_give_each_rows_scale_by_lane_and_leave_blocks_they_refuse",
            x86::avx2_scale_readers,
            x86::missing(),
        ),
        gated(
            "avx512_eight_row_chains_equal_the_portable_chains_on_every_code",
            x86::eight_row_chains,
            x86::missing_avx512(),
        ),
        gated(
            "avx512_bf16_and_f32_rows_read_in_place_equal_their_decoded_values_on_every_bf16",
            x86::stored_float_rows,
            x86::missing_avx512(),
        ),
        gated(
            "vnni_fp4_and_q4_block_sums_equal_the_exact_sums_at_the_integer_limits",
            x86::vnni_fp4_blocks,
            x86::missing_vnni(),
        ),
        gated(
            "vnni_index_dots_equal_their_definition_at_the_code_limits",
            x86::vnni_index_dots,
            x86::missing_vnni(),
        ),
        gated(
            "act_blocks_hold_quantised_inputs_exactly_and_decline_others",
            x86::act_blocks,
            x86::not_x86(),
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    use libtest_mimic::Failed;
    pub fn missing() -> Option<&'static str> {
        Some("SKIPPED: not an x86_64 build (no vector kernels)")
    }
    pub fn block_sums() -> Result<(), Failed> {
        Ok(())
    }
    pub fn single_codes() -> Result<(), Failed> {
        Ok(())
    }
    pub fn tile_decoders() -> Result<(), Failed> {
        Ok(())
    }
    pub fn avx512_tile_decoders() -> Result<(), Failed> {
        Ok(())
    }
    pub fn missing_avx512() -> Option<&'static str> {
        missing()
    }
    pub fn eight_row_blocks() -> Result<(), Failed> {
        Ok(())
    }
    pub fn eight_row_chains() -> Result<(), Failed> {
        Ok(())
    }
    pub fn c1_loops() -> Result<(), Failed> {
        Ok(())
    }
    pub fn c2_loop() -> Result<(), Failed> {
        Ok(())
    }
    pub fn vnni_fp4_loop() -> Result<(), Failed> {
        Ok(())
    }
    pub fn vq_loops() -> Result<(), Failed> {
        Ok(())
    }
    pub fn avx2_digit_loop() -> Result<(), Failed> {
        Ok(())
    }
    pub fn avx2_scale_readers() -> Result<(), Failed> {
        Ok(())
    }
    pub fn missing_vnni() -> Option<&'static str> {
        missing()
    }
    pub fn not_x86() -> Option<&'static str> {
        missing()
    }
    pub fn stored_float_rows() -> Result<(), Failed> {
        Ok(())
    }
    pub fn vnni_fp4_blocks() -> Result<(), Failed> {
        Ok(())
    }
    pub fn vnni_index_dots() -> Result<(), Failed> {
        Ok(())
    }
    pub fn act_blocks() -> Result<(), Failed> {
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use ds41_engine::dtype::{e2m1_pair, e4m3_to_f32, e8m0_to_f32};
    use ds41_engine::model::simd::vnni::{self, ActBlock};
    use ds41_engine::model::simd::{available, avx512, x86, Level};
    use libtest_mimic::Failed;

    const BLOCK: usize = 32;

    pub fn missing() -> Option<&'static str> {
        (available() < Level::Avx2)
            .then_some("SKIPPED: this CPU lacks AVX2/FMA/F16C (or DS41_SIMD=portable)")
    }

    pub fn missing_avx512() -> Option<&'static str> {
        (available() < Level::Avx512)
            .then_some("SKIPPED: this CPU lacks AVX-512 F/BW/VL/VBMI (or DS41_SIMD caps the level)")
    }

    pub fn missing_vnni() -> Option<&'static str> {
        (available() < Level::Avx512Vnni)
            .then_some("SKIPPED: this CPU lacks AVX-512 VNNI (or DS41_SIMD caps the level)")
    }

    /// The portable trials here need only an x86_64 build (they share its helpers).
    pub fn not_x86() -> Option<&'static str> {
        None
    }

    /// The C2 step on bf16 and f32 rows read from their stored bytes equals the step on the
    /// values `dtype::bf16_to_f32` (and `f32::from_le_bytes`) give, bit for bit, for every bf16
    /// pattern (NaNs, infinities and subnormals included), each alone among finite values (so
    /// that no other NaN or infinity decides the row), eight rows at a time.
    pub fn stored_float_rows() -> Result<(), Failed> {
        use avx512::F32Rows;
        use ds41_engine::dtype::bf16_to_f32;
        let x: [f64; BLOCK] = std::array::from_fn(|k| 1.0 + k as f64 / 64.0);
        for chunk in 0..(1usize << 16) / 8 {
            let column = chunk % BLOCK;
            let bits = |i: usize, k: usize| {
                if k == column {
                    (chunk * 8 + i) as u16
                } else {
                    0x3F80 + (i * BLOCK + k) as u16 // 1.0 and its neighbours
                }
            };
            let bf16: [[u8; 2 * BLOCK]; 8] = std::array::from_fn(|i| {
                std::array::from_fn(|b| bits(i, b / 2).to_le_bytes()[b % 2])
            });
            let values: [[f32; BLOCK]; 8] =
                std::array::from_fn(|i| std::array::from_fn(|k| bf16_to_f32(bits(i, k))));
            let f32_bytes: [[u8; 4 * BLOCK]; 8] = std::array::from_fn(|i| {
                std::array::from_fn(|b| values[i][b / 4].to_le_bytes()[b % 4])
            });
            let step = |rows: F32Rows| {
                let mut acc = [0.25f64; 8];
                // SAFETY: `missing_avx512` found the features, or this trial is not run.
                unsafe { avx512::f32_c2_block8(&mut acc, &x, rows) };
                acc.map(f64::to_bits)
            };
            let want = step(F32Rows::Values(&values));
            let (got16, got32) = (
                step(F32Rows::Bf16(std::array::from_fn(|i| &bf16[i]))),
                step(F32Rows::F32(std::array::from_fn(|i| &f32_bytes[i]))),
            );
            if got16 != want || got32 != want {
                return Err(format!(
                    "chunk {chunk}: bf16 {got16:x?}, f32 {got32:x?}, want {want:x?}"
                )
                .into());
            }
        }
        Ok(())
    }

    /// An act-quantised block's integer form gives back every input exactly; a block with a
    /// value off its grid (or not finite) has none.
    pub fn act_blocks() -> Result<(), Failed> {
        for seed in 0..256u64 {
            let x = quantised_inputs(seed);
            let Some(block) = ActBlock::of(&x) else {
                return Err(format!("seed {seed}: no integer form for {x:?}").into());
            };
            let back = block.inputs();
            if back.map(f64::to_bits) != x.map(|v| (v + 0.0).to_bits()) {
                return Err(format!("seed {seed}: {back:?} is not {x:?}").into());
            }
        }
        let mut x = quantised_inputs(7);
        let amax = x.iter().fold(0f64, |m, v| m.max(v.abs()));
        x[3] = amax * 2f64.powi(-20); // finer than any e4m3 step below amax
        if ActBlock::of(&x).is_some() {
            return Err("a value off the grid was taken as an integer".into());
        }
        for bad in [f64::NAN, f64::INFINITY] {
            x[5] = bad;
            if ActBlock::of(&x).is_some() {
                return Err(format!("{bad} was taken as an integer").into());
            }
            // Alone among zeros too (the sum is then not +0).
            let mut zeros = [0.0; BLOCK];
            zeros[9] = bad;
            if ActBlock::of(&zeros).is_some() {
                return Err(format!("{bad} among zeros was taken as an integer").into());
            }
        }
        if ActBlock::of(&[0.0; BLOCK]).map(|b| b.inputs()) != Some([0.0; BLOCK]) {
            return Err("an all-zero block has no integer form".into());
        }
        Ok(())
    }

    /// The VNNI FP4 and Q4G steps against the exact sums, with inputs at the integer form's
    /// extremes (|X| up to 2^19 − 1 next to the smallest steps) and every nibble in every
    /// column.
    pub fn vnni_fp4_blocks() -> Result<(), Failed> {
        let mut next = lcg(5);
        for seed in 0..512u64 {
            let mut x = quantised_inputs(seed);
            if seed % 3 == 0 {
                // The largest e4m3 magnitude (448 = 7 · 2^6) and the smallest step (2^-9)
                // of one scale, signs mixed: |X| reaches 448 · 2^9 · 2 = 458752 < 2^19.
                let scale = 2f64.powi((seed % 17) as i32 - 8);
                for (k, v) in x.iter_mut().enumerate() {
                    let m = if k % 4 == 0 { 2f64.powi(-9) } else { 448.0 };
                    *v = if next().is_multiple_of(2) { m } else { -m } * scale;
                }
            }
            let EightRows { s, fp4, .. } = eight_rows(seed, next());
            let fp4 = if seed % 3 == 0 {
                // Every weight ±6 (W = ±12): the largest sums.
                [[if seed % 2 == 0 { 0x77 } else { 0xF7 }; BLOCK / 2]; 8]
            } else {
                fp4
            };
            let Some(block) = ActBlock::of(&x) else {
                return Err(format!("seed {seed}: no integer form").into());
            };
            let acc: [f32; 8] = std::array::from_fn(|_| (next() as f32 - 2e9) * 1e-6);
            let mut got = acc;
            // SAFETY: `missing_vnni` found the features, or this trial is not run.
            unsafe {
                vnni::fp4_c1_block8_vnni(&mut got, &block, std::array::from_fn(|j| &fp4[j]), &s)
            };
            for j in 0..8 {
                let want = acc[j] + (exact(&x, |k| e2m1_pair(fp4[j][k / 2])[k % 2]) * s[j]) as f32;
                if got[j].to_bits() != want.to_bits() {
                    return Err(format!("seed {seed} row {j}: {} want {want}", got[j]).into());
                }
            }
            // The same rows as container Q4G values (nibble − 8; all −8 where the FP4 rows
            // are extreme) with f16 scales of every range (subnormal to 65504, either sign).
            let q4 = if seed % 3 == 0 {
                [[0u8; BLOCK / 2]; 8]
            } else {
                fp4
            };
            let f16_scales: [f64; 8] = std::array::from_fn(|_| {
                let bits = next() as u16;
                // Every exponent field but 31 (infinities and NaNs), which becomes 15.
                let bits = if bits & 0x7C00 == 0x7C00 {
                    bits & !0x4000
                } else {
                    bits
                };
                f64::from(half::f16::from_bits(bits).to_f32())
            });
            let mut got = acc;
            // SAFETY: as above.
            unsafe {
                vnni::q4_c1_block8_vnni(
                    &mut got,
                    &block,
                    std::array::from_fn(|j| &q4[j]),
                    &f16_scales,
                )
            };
            for j in 0..8 {
                let nibble = |k: usize| (q4[j][k / 2] >> (4 * (k % 2)) & 0x0F) as f32 - 8.0;
                let want = acc[j] + (exact(&x, nibble) * f16_scales[j]) as f32;
                if got[j].to_bits() != want.to_bits() {
                    return Err(format!("seed {seed} Q4 row {j}: {} want {want}", got[j]).into());
                }
            }
        }
        Ok(())
    }

    /// The VNNI index-dot kernel against its scalar definition (`KeyTile::dots`), bit for
    /// bit: keys and queries of 1 to 4 blocks whose codes reach ±127 (the biased query bytes
    /// 1 and 255), units from 2^−30 to 2^30, zero blocks, and partial tiles.
    pub fn vnni_index_dots() -> Result<(), Failed> {
        use ds41_engine::model::index_grid::{KeyTiles, QueryGrid, TILE_KEYS};
        let mut next = lcg(11);
        for seed in 0..256u32 {
            let blocks = 1 + (seed % 4) as usize;
            let dim = blocks * BLOCK;
            // A block of codes times a power of two: extreme codes, random ones, or zeros.
            let block = |next: &mut dyn FnMut() -> u32, out: &mut Vec<f32>| {
                let unit = 2f32.powi((next() % 61) as i32 - 30);
                let kind = next() % 4;
                for _ in 0..BLOCK {
                    let code = match kind {
                        0 => 0,
                        1 => {
                            if next() % 2 == 0 {
                                127
                            } else {
                                -127
                            }
                        }
                        _ => (next() % 255) as i32 - 127,
                    };
                    out.push(code as f32 * unit);
                }
            };
            let n_heads = 2;
            let mut iq = Vec::new();
            for _ in 0..n_heads * blocks {
                block(&mut next, &mut iq);
            }
            let n = 1 + (next() as usize % TILE_KEYS);
            let mut keys = Vec::new();
            for _ in 0..n * blocks {
                block(&mut next, &mut keys);
            }
            let mut tiles = KeyTiles::new(dim);
            tiles.extend(&keys, dim);
            let tile = tiles
                .tile(0)
                .ok_or("codes times a power of two are on the grid")?;
            let query = QueryGrid::of(&iq, dim, blocks).ok_or("the query is on the grid")?;
            for h in 0..n_heads {
                let want = tile.dots(query.head(h));
                let mut got = [f64::NAN; TILE_KEYS];
                // SAFETY: gated on VNNI (`missing_vnni`); query and tile have `blocks` blocks.
                unsafe { vnni::index_dots_vnni(&mut got, query.head(h), &tile) };
                for j in 0..TILE_KEYS {
                    if got[j].to_bits() != want[j].to_bits() {
                        return Err(format!(
                            "seed {seed} head {h} key {j}: {} want {}",
                            got[j], want[j]
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// A seeded 31-bit pseudo-random stream (a 64-bit LCG's high bits).
    fn lcg(seed: u64) -> impl FnMut() -> u32 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        }
    }

    /// Inputs of the kind C1 sums: e4m3 values times one power of two per block (an FP8
    /// act-quant). With a scale per value the sum is not exact and two summation orders differ
    /// (seen: one ulp), which is why only C1 reorders.
    fn quantised_inputs(seed: u64) -> [f64; BLOCK] {
        let mut s = seed;
        let scale = 2f64.powi((seed % 40) as i32 - 20);
        std::array::from_fn(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let code = (s >> 33) as u8;
            let v = e4m3_to_f32(if code & 0x7F == 0x7F { 0x7E } else { code });
            f64::from(v) * scale
        })
    }

    /// The block sum in increasing k. Every product is exact in f64 and so is the sum (C1), so
    /// this is the value any order must give.
    fn exact(x: &[f64; BLOCK], w: impl Fn(usize) -> f32) -> f64 {
        (0..BLOCK).map(|k| x[k] * f64::from(w(k))).sum()
    }

    pub fn block_sums() -> Result<(), Failed> {
        for seed in 0..64u64 {
            let x = quantised_inputs(seed);
            // Every code appears at every column across the seeds' rotations.
            let fp8: [u8; BLOCK] = std::array::from_fn(|k| (k as u64 * 8 + seed * 37) as u8);
            let fp4: [u8; BLOCK / 2] = std::array::from_fn(|k| (k as u64 * 17 + seed * 5) as u8);
            // SAFETY: `missing` found AVX2, FMA and F16C, or this trial is not run.
            let (got8, got4) =
                unsafe { (x86::fp8_block_sum(&x, &fp8), x86::fp4_block_sum(&x, &fp4)) };
            if fp8.iter().any(|c| c & 0x7F == 0x7F) {
                if got8.is_some() {
                    return Err(format!("seed {seed}: a NaN code must be left to the table").into());
                }
            } else {
                let want = exact(&x, |k| e4m3_to_f32(fp8[k]));
                if got8.map(f64::to_bits) != Some(want.to_bits()) {
                    return Err(format!("seed {seed}: fp8 {got8:?}, want {want}").into());
                }
            }
            let want4 = exact(&x, |k| e2m1_pair(fp4[k / 2])[k % 2]);
            if got4.to_bits() != want4.to_bits() {
                return Err(format!("seed {seed}: fp4 {got4}, want {want4}").into());
            }
        }
        Ok(())
    }

    pub fn single_codes() -> Result<(), Failed> {
        for code in 0..=255u8 {
            if code & 0x7F == 0x7F {
                continue;
            }
            for k in [0, 7, 8, 15, 16, 31] {
                let mut codes = [0u8; BLOCK];
                codes[k] = code;
                let mut x = [0f64; BLOCK];
                x[k] = 1.0;
                // SAFETY: as above.
                let got = unsafe { x86::fp8_block_sum(&x, &codes) };
                let want = f64::from(e4m3_to_f32(code));
                if got != Some(want) {
                    return Err(
                        format!("code {code:#04x} at column {k}: {got:?}, want {want}").into(),
                    );
                }
                if code < 16 {
                    let mut packed = [0u8; BLOCK / 2];
                    packed[k / 2] = if k % 2 == 0 { code } else { code << 4 };
                    // SAFETY: as above.
                    let got = unsafe { x86::fp4_block_sum(&x, &packed) };
                    let want = f64::from(e2m1_pair(code)[0]);
                    if got != want {
                        return Err(
                            format!("nibble {code} at column {k}: {got}, want {want}").into()
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The block decoders (eight rows into columns of a column-major block) against the table
    /// decoders, bit for bit: every code at every row and column across the seeds, scales
    /// from 2^−127 to 2^100, both signed zeros (e2m1 code 8 is +0.0, e4m3 0x80 is −0.0: a
    /// zero's sign can survive a chain), other columns untouched, NaN codes refused.
    pub fn tile_decoders() -> Result<(), Failed> {
        decoders_against_tables(|fp8, fp4, s, got8, got4, col| {
            // SAFETY: `missing` found AVX2, FMA and F16C, or this trial is not run.
            unsafe {
                x86::fp4_tile(std::array::from_fn(|j| &fp4[j]), s, got4, col);
                x86::fp8_tile(std::array::from_fn(|j| &fp8[j]), s, got8, col)
            }
        })
    }

    /// [`tile_decoders`] for the AVX-512 block decoders.
    pub fn avx512_tile_decoders() -> Result<(), Failed> {
        decoders_against_tables(|fp8, fp4, s, got8, got4, col| {
            // SAFETY: `missing_avx512` found the features, or this trial is not run.
            unsafe {
                avx512::fp4_columns(std::array::from_fn(|j| &fp4[j]), s, got4, col);
                avx512::fp8_columns(std::array::from_fn(|j| &fp8[j]), s, got8, col)
            }
        })
    }

    /// Columns `col .. col + 8` of 24 decoded by `decode` (FP8 rows, FP4 rows, scales, FP8
    /// block, FP4 block, col; `false` for refused NaN codes), checked as [`tile_decoders`] says.
    fn decoders_against_tables(
        decode: impl Fn(
            &[[u8; BLOCK]; 8],
            &[[u8; BLOCK / 2]; 8],
            &[f64; 8],
            &mut [[f64; 24]; BLOCK],
            &mut [[f64; 24]; BLOCK],
            usize,
        ) -> bool,
    ) -> Result<(), Failed> {
        const W: usize = 24;
        let mut next = lcg(7);
        for seed in 0..256usize {
            let scale_bytes: [u8; 8] = std::array::from_fn(|j| match (seed + j) % 4 {
                0 => 0,
                1 => 227,
                _ => 100 + (next() % 40) as u8,
            });
            let s: [f64; 8] = scale_bytes.map(|b| f64::from(e8m0_to_f32(b)));
            // Every code at every position over the seeds; NaN codes kept in one seed of four.
            let fp8: [[u8; BLOCK]; 8] = std::array::from_fn(|j| {
                std::array::from_fn(|k| {
                    let c = (k * 8 + j * 37 + seed * 3) as u8;
                    if c & 0x7F == 0x7F && seed % 4 != 0 {
                        c ^ 1
                    } else {
                        c
                    }
                })
            });
            let fp4: [[u8; BLOCK / 2]; 8] = std::array::from_fn(|j| {
                std::array::from_fn(|b| (b * 17 + j * 5 + seed * 11) as u8)
            });
            let col = (seed % 3) * 8;
            let fresh = [[f64::NAN; W]; BLOCK];
            let (mut got8, mut got4) = (fresh, fresh);
            let done = decode(&fp8, &fp4, &s, &mut got8, &mut got4, col);
            let nan = fp8.iter().flatten().any(|c| c & 0x7F == 0x7F);
            if done == nan {
                return Err(format!("seed {seed}: NaN codes {nan}, decoded {done}").into());
            }
            for k in 0..BLOCK {
                for i in 0..W {
                    let (want8, want4) = match i.checked_sub(col).filter(|&j| j < 8) {
                        Some(j) if !nan => (
                            f64::from(e4m3_to_f32(fp8[j][k])) * s[j],
                            f64::from(e2m1_pair(fp4[j][k / 2])[k % 2]) * s[j],
                        ),
                        Some(j) => (f64::NAN, f64::from(e2m1_pair(fp4[j][k / 2])[k % 2]) * s[j]),
                        None => (f64::NAN, f64::NAN),
                    };
                    if got8[k][i].to_bits() != want8.to_bits()
                        || got4[k][i].to_bits() != want4.to_bits()
                    {
                        return Err(format!(
                            "seed {seed} column {k} row {i}: fp8 {} want {want8}, fp4 {} want {want4}",
                            got8[k][i], got4[k][i]
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The AVX-512 eight-row C1 step against `acc + f32(exact block sum · scale)` per row, bit
    /// for bit: every code at every row and column across the seeds, inputs of an FP8
    /// act-quant, scales from 2^−127 to 2^118, and a NaN code refused with `acc` untouched.
    /// Then each code alone (one row, one column, input 1) must give exactly its value, so a
    /// code placed in the wrong lane or row cannot hide in a sum.
    pub fn eight_row_blocks() -> Result<(), Failed> {
        let mut next = lcg(3);
        let step = |acc: &[f32; 8],
                    x: &[f64; BLOCK],
                    fp8: &[[u8; BLOCK]; 8],
                    fp4: &[[u8; BLOCK / 2]; 8],
                    s: &[f64; 8]| {
            let (mut a8, mut a4) = (*acc, *acc);
            // SAFETY: `missing_avx512` found the features, or this trial is not run.
            let done = unsafe {
                avx512::fp4_c1_block8(&mut a4, x, std::array::from_fn(|j| &fp4[j]), s);
                avx512::fp8_c1_block8(&mut a8, x, std::array::from_fn(|j| &fp8[j]), s)
            };
            (done, a8, a4)
        };
        for seed in 0..512u64 {
            let x = quantised_inputs(seed);
            let EightRows { s, fp8, fp4 } = eight_rows(seed, next());
            let acc: [f32; 8] = std::array::from_fn(|_| (next() as f32 - 2e9) * 1e-6);
            let (done, got8, got4) = step(&acc, &x, &fp8, &fp4, &s);
            let nan = fp8.iter().flatten().any(|c| c & 0x7F == 0x7F);
            if done == nan {
                return Err(format!("seed {seed}: NaN codes {nan}, summed {done}").into());
            }
            for j in 0..8 {
                let want8 = if nan {
                    acc[j]
                } else {
                    acc[j] + (exact(&x, |k| e4m3_to_f32(fp8[j][k])) * s[j]) as f32
                };
                let want4 = acc[j] + (exact(&x, |k| e2m1_pair(fp4[j][k / 2])[k % 2]) * s[j]) as f32;
                if got8[j].to_bits() != want8.to_bits() || got4[j].to_bits() != want4.to_bits() {
                    return Err(format!(
                        "seed {seed} row {j}: fp8 {} want {want8}, fp4 {} want {want4}",
                        got8[j], got4[j]
                    )
                    .into());
                }
            }
        }
        let ones = [1f64; BLOCK];
        let unit = [1f64; 8];
        for code in (0..=255u8).filter(|c| c & 0x7F != 0x7F) {
            for (row, k) in [(0, 0), (3, 7), (4, 8), (5, 17), (7, 31)] {
                let mut fp8 = [[0u8; BLOCK]; 8];
                let mut fp4 = [[0u8; BLOCK / 2]; 8];
                fp8[row][k] = code;
                fp4[row][k / 2] = if k % 2 == 0 { code & 0xF } else { code << 4 };
                let (_, got8, got4) = step(&[0.0; 8], &ones, &fp8, &fp4, &unit);
                for j in 0..8 {
                    let (want8, want4) = if j == row {
                        (e4m3_to_f32(code), e2m1_pair(code & 0xF)[0])
                    } else {
                        (0.0, 0.0)
                    };
                    // A zero block sum is +0 in every kernel (the sums start from +0).
                    if got8[j] != want8 || got4[j] != want4 {
                        return Err(format!(
                            "code {code:#04x} at row {row} column {k}: row {j} fp8 {} want \
                             {want8}, fp4 {} want {want4}",
                            got8[j], got4[j]
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The AVX-512 eight-row C2 step against the portable chain (`acc + x·(code·scale)`, one
    /// rounding per k, k increasing) per row, bit for bit: every code at every row and column
    /// across the seeds, inputs of any f32 value (C2 does not need act-quant inputs), chains
    /// starting from +0, −0 and earlier values, scales from 2^−127 to 2^118, a NaN code
    /// refused with the chains untouched.
    pub fn eight_row_chains() -> Result<(), Failed> {
        let mut next = lcg(5);
        for seed in 0..512u64 {
            let x: [f64; BLOCK] =
                std::array::from_fn(|_| f64::from(f32::from_bits(next() & 0xBFFF_FFFF) * 1e-3));
            let EightRows { s, fp8, fp4 } = eight_rows(seed, next());
            let acc: [f64; 8] = std::array::from_fn(|j| match (seed as usize + j) % 3 {
                0 => 0.0,
                1 => -0.0,
                _ => f64::from(next() as f32 - 2e9) * 1e-3,
            });
            let (mut got8, mut got4) = (acc, acc);
            // SAFETY: `missing_avx512` found the features, or this trial is not run.
            let done = unsafe {
                avx512::fp4_c2_block8(&mut got4, &x, std::array::from_fn(|j| &fp4[j]), &s);
                avx512::fp8_c2_block8(&mut got8, &x, std::array::from_fn(|j| &fp8[j]), &s)
            };
            let nan = fp8.iter().flatten().any(|c| c & 0x7F == 0x7F);
            if done == nan {
                return Err(format!("seed {seed}: NaN codes {nan}, chained {done}").into());
            }
            for j in 0..8 {
                let chain = |w: &dyn Fn(usize) -> f32| {
                    (0..BLOCK).fold(acc[j], |a, k| a + x[k] * (f64::from(w(k)) * s[j]))
                };
                let want8 = if nan {
                    acc[j]
                } else {
                    chain(&|k| e4m3_to_f32(fp8[j][k]))
                };
                let want4 = chain(&|k| e2m1_pair(fp4[j][k / 2])[k % 2]);
                if got8[j].to_bits() != want8.to_bits() || got4[j].to_bits() != want4.to_bits() {
                    return Err(format!(
                        "seed {seed} row {j}: fp8 {} want {want8}, fp4 {} want {want4}",
                        got8[j], got4[j]
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Blocks of eight release rows for the loop trials: `blocks` column blocks made by
    /// [`eight_rows`] (NaN codes in one seed of four), their scale bytes (one block in seven
    /// above the limit), and act-quantised inputs.
    struct LoopRows {
        fp8: Vec<[u8; BLOCK * LOOP_BLOCKS]>,
        fp4: Vec<[u8; BLOCK / 2 * LOOP_BLOCKS]>,
        scales: Vec<[u8; LOOP_BLOCKS]>,
        x: Vec<f64>,
    }

    const LOOP_BLOCKS: usize = 40;
    const LOOP_LIMIT: u8 = 245;

    fn loop_rows(seed: u64, shared: bool) -> LoopRows {
        let mut next = lcg(seed + 11);
        let mut rows = LoopRows {
            fp8: vec![[0; BLOCK * LOOP_BLOCKS]; 8],
            fp4: vec![[0; BLOCK / 2 * LOOP_BLOCKS]; 8],
            scales: vec![[0; LOOP_BLOCKS]; 8],
            x: Vec::new(),
        };
        for kb in 0..LOOP_BLOCKS {
            let block_seed = seed * 64 + kb as u64;
            let EightRows { fp8, fp4, .. } = eight_rows(block_seed, next());
            for j in 0..8 {
                rows.fp8[j][kb * BLOCK..][..BLOCK].copy_from_slice(&fp8[j]);
                rows.fp4[j][kb * BLOCK / 2..][..BLOCK / 2].copy_from_slice(&fp4[j]);
                let byte = match next() % 7 {
                    0 if kb % 3 == 0 => LOOP_LIMIT + 1 + (next() % 9) as u8,
                    r => [0, LOOP_LIMIT, 127, 100, 140, 90, 120][r as usize],
                };
                rows.scales[j][kb] = if shared && j > 0 {
                    rows.scales[0][kb]
                } else {
                    byte
                };
            }
            rows.x.extend(quantised_inputs(block_seed));
        }
        rows
    }

    /// A loop kernel (`run(acc, blocks)`, returning where it stopped) against its
    /// single-block `step`, as the engine drives it: from each stop on, the loop must give the
    /// steps' sums, bit for bit, and stop exactly at the next block it `leaves`; it is resumed
    /// after that block. Some block must be left, or the trial proves nothing.
    fn loop_equals_steps<const N: usize, T: Copy + std::fmt::Debug + PartialEq>(
        seed: u64,
        leaves: impl Fn(usize) -> bool,
        mut step: impl FnMut(usize, &mut [T; N]),
        mut run: impl FnMut(&mut [T; N], std::ops::Range<usize>) -> usize,
        (start, bits): (T, fn(T) -> u64),
    ) -> Result<(), Failed> {
        let (mut got, mut want) = ([start; N], [start; N]);
        let (mut kb, mut stops) = (0, 0);
        while kb < LOOP_BLOCKS {
            let expected = (kb..LOOP_BLOCKS)
                .find(|&b| leaves(b))
                .unwrap_or(LOOP_BLOCKS);
            (kb..expected).for_each(|b| step(b, &mut want));
            kb = run(&mut got, kb..LOOP_BLOCKS);
            if kb != expected || got.map(bits) != want.map(bits) {
                return Err(format!(
                    "seed {seed}: stopped at {kb} (want {expected}), acc {got:?} want {want:?}"
                )
                .into());
            }
            stops += usize::from(kb < LOOP_BLOCKS);
            kb += 1;
        }
        if stops == 0 {
            return Err(format!("seed {seed}: no block was left; the trial is too weak").into());
        }
        Ok(())
    }

    fn f32_bits(v: f32) -> u64 {
        u64::from(v.to_bits())
    }

    /// The AVX-512 VQ loops (32 rows of one index band) against the definition written out
    /// here (CONTAINER.md §4.2: a row's stage entries added in f32 from +0.0, times its
    /// scale) and the rules' chains (C2: one chain in increasing k; C1 on VQ rows: one chain
    /// from +0.0 per 32-column block, rounded to f32 and added in f32), bit for bit, in each
    /// index format and for both halves of a band. The codebooks hold ±0 and values whose f32
    /// sums round, the scales have both signs, and two rows select −0.0 entries only: zeros
    /// whose sign the sum from +0.0 decides.
    pub fn vq_loops() -> Result<(), Failed> {
        let mut next = lcg(77);
        vq_format::<3, 256, false>(&mut next)?;
        vq_format::<4, 64, true>(&mut next)?;
        vq_format::<4, 256, false>(&mut next)
    }

    fn vq_format<const S: usize, const E: usize, const PACKED: bool>(
        next: &mut impl FnMut() -> u32,
    ) -> Result<(), Failed> {
        use ds41_engine::model::simd::vq::{
            vq_c1_run32, vq_c1_run32_avx2, vq_c2_run32, vq_c2_run32_avx2, VqRun, VQ_RUN_ROWS,
        };
        use std::ops::Range;
        const VECTORS: usize = 12;
        const BAND: usize = 64;
        let bytes = if PACKED { 3 } else { S };
        let palette = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            3.0e-8,
            -7.5e-9,
            1.5,
            0.333_333_34,
            65504.0,
            -6.1e-5,
        ];
        let books: Vec<Vec<[f32; 8]>> = (0..S)
            .map(|_| {
                (0..E)
                    .map(|e| {
                        std::array::from_fn(|_| {
                            if e == 0 {
                                -0.0
                            } else {
                                palette[next() as usize % palette.len()]
                            }
                        })
                    })
                    .collect()
            })
            .collect();
        let mut indices: Vec<u8> = (0..VECTORS * BAND * bytes).map(|_| next() as u8).collect();
        for v in 0..VECTORS {
            for row in [5, 40] {
                indices[(v * BAND + row) * bytes..][..bytes].fill(0);
            }
        }
        let scales: Vec<f32> = (0..BAND)
            .map(|_| {
                let s = 0.25 + (next() % 1000) as f32 / 250.0;
                if next().is_multiple_of(2) {
                    s
                } else {
                    -s
                }
            })
            .collect();
        // Positive inputs: a row of zeros keeps its weights' sign.
        let x: Vec<f64> = (0..VECTORS * 8)
            .map(|_| f64::from([1.0f32, 0.5, 3.0e-8, 1.5, 1.0e6, 0.7][next() as usize % 6]))
            .collect();
        let weight = |row: usize, v: usize| -> [f32; 8] {
            let b = &indices[(v * BAND + row) * bytes..][..bytes];
            let sel: Vec<usize> = if PACKED {
                let bits = u32::from(b[0]) | (u32::from(b[1]) << 8) | (u32::from(b[2]) << 16);
                (0..4).map(|i| (bits >> (6 * i) & 63) as usize).collect()
            } else {
                b.iter().map(|&i| usize::from(i)).collect()
            };
            std::array::from_fn(|t| {
                let mut acc = 0.0f32;
                for (s, &e) in sel.iter().enumerate() {
                    acc += books[s][e][t];
                }
                scales[row] * acc
            })
        };
        let refs: [&[[f32; 8]; E]; S] =
            std::array::from_fn(|s| books[s][..].try_into().expect("E entries"));
        for r0 in [0, VQ_RUN_ROWS] {
            let row_scales: &[f32; VQ_RUN_ROWS] =
                scales[r0..r0 + VQ_RUN_ROWS].try_into().expect("32 scales");
            let rows = VqRun::<S, E, PACKED> {
                books: refs,
                indices: &indices,
                first: r0 * bytes,
                scales: row_scales,
            };
            // The definition, row by row: C2's chain and C1's sum of rounded blocks.
            let want: Vec<(f64, f32)> = (0..VQ_RUN_ROWS)
                .map(|i| {
                    let (mut chain, mut sum) = (-0.0f64, 0f32);
                    for kb in 0..VECTORS / 4 {
                        let mut block = 0.0f64;
                        for v in 4 * kb..4 * kb + 4 {
                            for (t, &w) in weight(r0 + i, v).iter().enumerate() {
                                chain = x[8 * v + t].mul_add(f64::from(w), chain);
                                block = x[8 * v + t].mul_add(f64::from(w), block);
                            }
                        }
                        sum += block as f32;
                    }
                    (chain, sum)
                })
                .collect();
            // Each vector level's loops: the AVX2 ones, and the AVX-512 ones where the CPU has
            // them (`missing` found AVX2, or this trial is not run).
            type C2<R> = unsafe fn(&mut [f64; VQ_RUN_ROWS], &[f64], R, Range<usize>);
            type C1<R> = unsafe fn(&mut [f32; VQ_RUN_ROWS], &[f64], R, Range<usize>);
            let mut levels: Vec<(&str, C2<VqRun<S, E, PACKED>>, C1<VqRun<S, E, PACKED>>)> =
                vec![("avx2", vq_c2_run32_avx2, vq_c1_run32_avx2)];
            if available() >= Level::Avx512 {
                levels.push(("avx512", vq_c2_run32, vq_c1_run32));
            }
            for (level, c2_run, c1_run) in levels {
                let (mut c2, mut c2_resumed, mut c1) = (
                    [-0.0f64; VQ_RUN_ROWS],
                    [-0.0f64; VQ_RUN_ROWS],
                    [0f32; VQ_RUN_ROWS],
                );
                // SAFETY: the CPU has the level's features (above); the indices and inputs hold
                // every vector.
                unsafe {
                    c2_run(&mut c2, &x, rows, 0..VECTORS);
                    c2_run(&mut c2_resumed, &x, rows, 0..5);
                    c2_run(&mut c2_resumed, &x, rows, 5..VECTORS);
                    c1_run(&mut c1, &x, rows, 0..VECTORS / 4);
                }
                for (i, &(chain, sum)) in want.iter().enumerate() {
                    let what = format!("{level} S {S}, E {E}, packed {PACKED}: row {}", r0 + i);
                    if c2[i].to_bits() != chain.to_bits()
                        || c2_resumed[i].to_bits() != chain.to_bits()
                    {
                        return Err(format!(
                            "{what}: C2 {} / resumed {}, want {chain}",
                            c2[i], c2_resumed[i]
                        )
                        .into());
                    }
                    if c1[i].to_bits() != sum.to_bits() {
                        return Err(format!("{what}: C1 {}, want {sum}", c1[i]).into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The AVX-512 32-row FP8 C2 loop against its eight-row single-block step on each group,
    /// bit for bit, over 40 blocks of one scale byte per block: the same chains, and a stop at
    /// exactly each block with a NaN code in any row or a scale above the limit.
    pub fn c2_loop() -> Result<(), Failed> {
        let mut next = lcg(17);
        for seed in 0..24u64 {
            let groups: Vec<LoopRows> = (0..4).map(|g| loop_rows(seed * 4 + g, true)).collect();
            let codes: [&[u8]; 32] = std::array::from_fn(|i| &groups[i / 8].fp8[i % 8][..]);
            let scales = &groups[0].scales[0];
            let x: Vec<f64> = (0..BLOCK * LOOP_BLOCKS)
                .map(|_| f64::from(f32::from_bits(next() & 0xBFFF_FFFF) * 1e-3))
                .collect();
            let leaves = |kb: usize| {
                scales[kb] > LOOP_LIMIT
                    || codes
                        .iter()
                        .any(|row| row[kb * BLOCK..][..BLOCK].iter().any(|c| c & 0x7F == 0x7F))
            };
            let step = |kb: usize, acc: &mut [f64; 32]| {
                let xb: &[f64; BLOCK] = x[kb * BLOCK..][..BLOCK].try_into().expect("block");
                let s = [f64::from(e8m0_to_f32(scales[kb])); 8];
                for (g, chains) in acc.chunks_exact_mut(8).enumerate() {
                    let block = std::array::from_fn(|j| {
                        codes[8 * g + j][kb * BLOCK..][..BLOCK]
                            .try_into()
                            .expect("block")
                    });
                    let chains: &mut [f64; 8] = chains.try_into().expect("eight");
                    // SAFETY: `missing_avx512` found the features, or this trial is not run.
                    let done = unsafe { avx512::fp8_c2_block8(chains, xb, block, &s) };
                    assert!(done, "block {kb} has no NaN code");
                }
            };
            // SAFETY: as above; the rows, inputs and scales hold LOOP_BLOCKS blocks.
            let run = |acc: &mut [f64; 32], blocks| unsafe {
                avx512::fp8_c2_run32(
                    acc,
                    &x,
                    &codes,
                    avx512::RowScales {
                        bytes: avx512::ScaleBytes::Shared(&scales[..]),
                        limit: LOOP_LIMIT,
                    },
                    blocks,
                )
            };
            loop_equals_steps(seed, leaves, step, run, (-0.0, f64::to_bits))?;
            // The FP4 loop over the same groups: scales per row and block.
            let codes: [&[u8]; 32] = std::array::from_fn(|i| &groups[i / 8].fp4[i % 8][..]);
            let row_scales = |i: usize| &groups[i / 8].scales[i % 8];
            let leaves = |kb: usize| (0..32).any(|i| row_scales(i)[kb] > LOOP_LIMIT);
            let step = |kb: usize, acc: &mut [f64; 32]| {
                let xb: &[f64; BLOCK] = x[kb * BLOCK..][..BLOCK].try_into().expect("block");
                for (g, chains) in acc.chunks_exact_mut(8).enumerate() {
                    let block = std::array::from_fn(|j| {
                        codes[8 * g + j][kb * BLOCK / 2..][..BLOCK / 2]
                            .try_into()
                            .expect("block")
                    });
                    let s =
                        std::array::from_fn(|j| f64::from(e8m0_to_f32(row_scales(8 * g + j)[kb])));
                    let chains: &mut [f64; 8] = chains.try_into().expect("eight");
                    // SAFETY: as above.
                    unsafe { avx512::fp4_c2_block8(chains, xb, block, &s) };
                }
            };
            let group_scales = |g: usize| avx512::RowScales {
                bytes: avx512::ScaleBytes::PerRow(std::array::from_fn(|j| {
                    &row_scales(8 * g + j)[..]
                })),
                limit: LOOP_LIMIT,
            };
            // SAFETY: as above.
            let run = |acc: &mut [f64; 32], blocks| unsafe {
                let scales = [
                    group_scales(0),
                    group_scales(1),
                    group_scales(2),
                    group_scales(3),
                ];
                avx512::fp4_c2_run32(acc, &x, &codes, scales, blocks)
            };
            loop_equals_steps(seed, leaves, step, run, (-0.0, f64::to_bits))?;
        }
        Ok(())
    }

    /// The AVX-512 FP8 C1 loop against its single-block step, bit for bit, over 40 blocks
    /// with scales shared by the eight rows and one per row: the same sums, and a stop at
    /// exactly each block with a NaN code or a scale above the limit (the loop is then resumed
    /// after it, as the caller does).
    pub fn c1_loops() -> Result<(), Failed> {
        for seed in 0..48u64 {
            let shared = seed % 2 == 0;
            let rows = loop_rows(seed, shared);
            let codes: [&[u8]; 8] = std::array::from_fn(|j| &rows.fp8[j][..]);
            let scales = avx512::RowScales {
                bytes: if shared {
                    avx512::ScaleBytes::Shared(&rows.scales[0])
                } else {
                    avx512::ScaleBytes::PerRow(std::array::from_fn(|j| &rows.scales[j][..]))
                },
                limit: LOOP_LIMIT,
            };
            let leaves = |kb: usize| {
                (0..8).any(|j| {
                    rows.scales[j][kb] > LOOP_LIMIT
                        || rows.fp8[j][kb * BLOCK..][..BLOCK]
                            .iter()
                            .any(|c| c & 0x7F == 0x7F)
                })
            };
            let step = |kb: usize, acc: &mut [f32; 8]| {
                let x: &[f64; BLOCK] = rows.x[kb * BLOCK..][..BLOCK].try_into().expect("block");
                let block = std::array::from_fn(|j| {
                    rows.fp8[j][kb * BLOCK..][..BLOCK]
                        .try_into()
                        .expect("block")
                });
                let s = std::array::from_fn(|j| f64::from(e8m0_to_f32(rows.scales[j][kb])));
                // SAFETY: `missing_avx512` found the features, or this trial is not run.
                let done = unsafe { avx512::fp8_c1_block8(acc, x, block, &s) };
                assert!(done, "block {kb} has no NaN code");
            };
            // SAFETY: as above; the rows and inputs hold LOOP_BLOCKS blocks.
            let run = |acc: &mut [f32; 8], blocks| unsafe {
                avx512::fp8_c1_run8(acc, &rows.x, codes, scales, blocks)
            };
            loop_equals_steps(seed, leaves, step, run, (0.5, f32_bits))?;
        }
        Ok(())
    }

    /// The VNNI nibble C1 loop against its single-block steps, as [`c1_loops`], on release FP4
    /// rows and on the same bytes as container Q4G rows: the same sums and a stop at exactly
    /// each block whose scale the step does not take.
    pub fn vnni_fp4_loop() -> Result<(), Failed> {
        for seed in 0..48u64 {
            let rows = loop_rows(seed, false);
            let codes: [&[u8]; 8] = std::array::from_fn(|j| &rows.fp4[j][..]);
            let x: Vec<ActBlock> = rows
                .x
                .chunks_exact(BLOCK)
                .map(|b| ActBlock::of(b.try_into().expect("block")).expect("act-quantised"))
                .collect();
            let scales = avx512::RowScales {
                bytes: avx512::ScaleBytes::PerRow(std::array::from_fn(|j| &rows.scales[j][..])),
                limit: LOOP_LIMIT,
            };
            let leaves = |kb: usize| (0..8).any(|j| rows.scales[j][kb] > LOOP_LIMIT);
            let step = |kb: usize, acc: &mut [f32; 8]| {
                let block = std::array::from_fn(|j| {
                    rows.fp4[j][kb * BLOCK / 2..][..BLOCK / 2]
                        .try_into()
                        .expect("block")
                });
                let s = std::array::from_fn(|j| f64::from(e8m0_to_f32(rows.scales[j][kb])));
                // SAFETY: `missing_vnni` found the features, or this trial is not run.
                unsafe { vnni::fp4_c1_block8_vnni(acc, &x[kb], block, &s) };
            };
            // SAFETY: as above; the rows and inputs hold LOOP_BLOCKS blocks.
            let run = |acc: &mut [f32; 8], blocks| unsafe {
                vnni::nibble_c1_run8_vnni(
                    acc,
                    &x,
                    codes,
                    vnni::NibbleScales::Fp4(scales),
                    avx512::NextRows::NONE,
                    blocks,
                )
            };
            loop_equals_steps(seed, leaves, step, run, (0.5, f32_bits))?;
            // The same rows read as container Q4G (value `nibble − 8`) with f16 scales in
            // groups of two blocks, of both signs and 2^−24 .. 2^9 (subnormals included), one group in seven of one
            // row infinite or NaN: the loop stops at its first block as the step declines it.
            let mut next = lcg(seed + 5);
            const GROUP_BLOCKS: usize = 2;
            let f16_rows: Vec<Vec<u8>> = (0..8)
                .map(|j| {
                    (0..LOOP_BLOCKS / GROUP_BLOCKS)
                        .flat_map(|g| {
                            let bits = if (g as u64 + seed) % 7 == 3 && j as u64 == seed % 8 {
                                if seed % 2 == 0 {
                                    0x7C00
                                } else {
                                    0xFE00
                                }
                            } else {
                                let sign = (next() % 2) << 15;
                                sign | ((next() % 25) << 10) | (next() % 1024)
                            };
                            (bits as u16).to_le_bytes()
                        })
                        .collect()
                })
                .collect();
            let f16_at = |j: usize, kb: usize| {
                let at = 2 * (kb / GROUP_BLOCKS);
                half::f16::from_le_bytes([f16_rows[j][at], f16_rows[j][at + 1]])
            };
            let leaves = |kb: usize| (0..8).any(|j| !f16_at(j, kb).is_finite());
            let step = |kb: usize, acc: &mut [f32; 8]| {
                let block = std::array::from_fn(|j| {
                    rows.fp4[j][kb * BLOCK / 2..][..BLOCK / 2]
                        .try_into()
                        .expect("block")
                });
                let s = std::array::from_fn(|j| f64::from(f16_at(j, kb).to_f32()));
                // SAFETY: as above.
                unsafe { vnni::q4_c1_block8_vnni(acc, &x[kb], block, &s) };
            };
            let q4 = vnni::NibbleScales::Q4 {
                rows: std::array::from_fn(|j| &f16_rows[j][..]),
                blocks_per_group: GROUP_BLOCKS,
            };
            // SAFETY: as above.
            let run = |acc: &mut [f32; 8], blocks| unsafe {
                vnni::nibble_c1_run8_vnni(acc, &x, codes, q4, avx512::NextRows::NONE, blocks)
            };
            loop_equals_steps(seed, leaves, step, run, (0.5, f32_bits))?;
        }
        Ok(())
    }

    /// The AVX2 decode kernels' scale readers (`avx2_scales`) on sixteen rows read in a
    /// permuted lane order (as `c2_run16` reads them): E8M0 bytes against `e8m0_to_f32`, a
    /// block with one byte past the limit left; f16 group scales against `half`, the blocks
    /// of a group with an infinite or NaN scale left.
    pub fn avx2_scale_readers() -> Result<(), Failed> {
        use ds41_engine::model::simd::avx2_scales::{BlockScales, E8m0Blocks, E8m0Rows, F16Rows};
        use std::arch::x86_64::{__m256d, _mm256_storeu_pd};
        let row_of = |field: usize| (5 * field + 3) % 16;
        let lanes = |vectors: &[__m256d]| -> Vec<f64> {
            vectors
                .iter()
                .flat_map(|v| {
                    let mut four = [0f64; 4];
                    // SAFETY: `missing` found AVX2, or this trial is not run.
                    unsafe { _mm256_storeu_pd(four.as_mut_ptr(), *v) };
                    four
                })
                .collect()
        };
        // Scale bytes from 1 to `top` (at most the limit, 200), spread over rows and blocks.
        let table = |rows: usize, blocks: usize, (a, b, top): (usize, usize, usize)| {
            (0..rows)
                .map(|r| {
                    (0..blocks)
                        .map(|kb| ((a * r + b * kb) % top + 1) as u8)
                        .collect()
                })
                .collect::<Vec<Vec<u8>>>()
        };
        // And one of 201 (row 11, block 4) past the limit.
        let mut bytes = table(16, 9, (29, 17, 199));
        bytes[11][4] = 201;
        let e8m0 = E8m0Rows::<16>::new(std::array::from_fn(|r| &bytes[r][..]), 200, 9);
        for kb in 0..9 {
            // SAFETY: as above; kb is within the 9 blocks checked.
            let got = unsafe { e8m0.vectors::<4>(kb, row_of) };
            match got {
                None if kb == 4 => {}
                Some(v) if kb != 4 => {
                    let want: Vec<f64> = (0..16)
                        .map(|f| f64::from(e8m0_to_f32(bytes[row_of(f)][kb])))
                        .collect();
                    if lanes(&v) != want {
                        return Err(format!("E8M0 block {kb}: wrong scales").into());
                    }
                }
                _ => return Err(format!("E8M0 block {kb}: left or taken wrongly").into()),
            }
        }
        // Eight rows transposed block-major (`E8m0Blocks`, made once per kernel call): 37
        // blocks (two runs of sixteen and a tail) read in three row orders. A byte past the
        // limit in a run (row 5, block 21) or in the tail (row 2, block 35) ends every row
        // there; one before the call's first block (row 1, block 2 of a call from block 3)
        // ends nothing, nor does no such byte.
        for (range, refused) in [
            (0..37, Some((5, 21))),
            (0..37, Some((2, 35))),
            (3..37, Some((1, 2))),
            (0..37, None),
        ] {
            let mut bytes = table(8, 37, (31, 7, 200));
            if let Some((r, kb)) = refused {
                bytes[r][kb] = 201;
            }
            let end = refused.map_or(37, |(_, kb)| if kb < range.start { 37 } else { kb });
            let mut buffer = E8m0Blocks::<8>::buffer();
            let rows = std::array::from_fn(|r| &bytes[r][..]);
            // SAFETY: as above.
            let reader = unsafe { E8m0Blocks::of(&mut buffer, rows, 200, range.clone()) }
                .ok_or("E8M0 blocks: not made for 37 blocks of eight rows")?;
            let orders: [&dyn Fn(usize) -> usize; 3] = [&|f| f, &|f| 4 + f, &|f| (3 * f + 1) % 8];
            for (o, row_of) in orders.iter().enumerate() {
                for kb in range.clone() {
                    // SAFETY: as above; kb is within the blocks the reader was made for.
                    let got = unsafe { reader.vectors::<1>(kb, row_of) };
                    let at = format!("E8M0 blocks {range:?}, order {o}, block {kb}");
                    match got {
                        None if kb >= end => {}
                        Some([v]) if kb < end => {
                            let want: Vec<f64> = (0..4)
                                .map(|f| f64::from(e8m0_to_f32(bytes[row_of(f)][kb])))
                                .collect();
                            if lanes(&[v]) != want {
                                return Err(format!("{at}: wrong scales").into());
                            }
                        }
                        _ => return Err(format!("{at}: left or taken wrongly").into()),
                    }
                }
            }
        }
        // f16 scales in groups of three blocks; row 6's group 2 infinite, row 9's group 3 NaN.
        let half_bits = |r: usize, g: usize| match (r, g) {
            (6, 2) => 0xFC00u16,
            (9, 3) => 0x7E01,
            _ => ((r * 977 + g * 131) % 0x7C00) as u16 | ((r + g) as u16 & 1) << 15,
        };
        let halves: Vec<Vec<u8>> = (0..16)
            .map(|r| (0..4).flat_map(|g| half_bits(r, g).to_le_bytes()).collect())
            .collect();
        let f16 = F16Rows::<16>::new(std::array::from_fn(|r| &halves[r][..]), 3, 12);
        for kb in 0..12 {
            // SAFETY: as above; kb is within the 12 blocks checked.
            let got = unsafe { f16.vectors::<4>(kb, row_of) };
            match got {
                None if kb >= 6 => {}
                Some(v) if kb < 6 => {
                    let want: Vec<f64> = (0..16)
                        .map(|f| f64::from(half::f16::from_bits(half_bits(row_of(f), kb / 3))))
                        .collect();
                    if lanes(&v) != want {
                        return Err(format!("f16 block {kb}: wrong scales").into());
                    }
                }
                _ => return Err(format!("f16 block {kb}: left or taken wrongly").into()),
            }
        }
        Ok(())
    }

    /// The AVX2 integer loops (`avx2_digits`: release FP4, container Q4G and Q8G) against
    /// the exact block sums, as the engine drives them: every e2m1 nibble and every signed
    /// byte at every column, E8M0 scales from 2^−127 up with some above the loop's limit, f16
    /// group scales of both signs and every range with some infinite or NaN, and input blocks
    /// that need one, two and three digits (one and two word passes).
    pub fn avx2_digit_loop() -> Result<(), Failed> {
        use ds41_engine::model::simd::avx2::{Codes, Scales};
        use ds41_engine::model::simd::avx2_digits::{
            nibble_c1_run8, q8_c1_run8, ByteInputs, NibbleInputs,
        };
        let (mut counts, mut splits) = ([0usize; 4], [0usize; 2]);
        for seed in 0..48u64 {
            let mut rows = loop_rows(seed, false);
            // Blocks of inputs within 3 and within 9 octaves of their largest (one and two
            // digits); the others span all of e4m3 (mostly three).
            let mut next = lcg(seed + 3);
            for (kb, x) in rows.x.chunks_exact_mut(BLOCK).enumerate() {
                let least_field = [0, 12, 6][kb % 3];
                if least_field > 0 {
                    let scale = 2f64.powi((kb % 9) as i32 - 4);
                    for v in x.iter_mut() {
                        let field = least_field + next() % (15 - least_field);
                        let code = (next() & 0x87) as u8 | (field << 3) as u8;
                        *v = f64::from(e4m3_to_f32(code)) * scale;
                    }
                }
            }
            let mut inputs = NibbleInputs::default();
            let Some(x) = inputs.fill(&rows.x) else {
                return Err(format!("seed {seed}: no integer form").into());
            };
            x.iter()
                .for_each(|b| counts[usize::from(b.digit_count())] += 1);
            let codes: [&[u8]; 8] = std::array::from_fn(|j| &rows.fp4[j][..]);
            let nibble = |j: usize, k: usize| rows.fp4[j][k / 2] >> (4 * (k % 2)) & 0x0F;
            let block_sum = |j: usize, kb: usize, value: &dyn Fn(u8) -> f32| {
                let xb = rows.x[kb * BLOCK..][..BLOCK].try_into().expect("block");
                exact(xb, |k| value(nibble(j, kb * BLOCK + k)))
            };
            let e2m1 = |n: u8| e2m1_pair(n)[0];
            let leaves = |kb: usize| (0..8).any(|j| rows.scales[j][kb] > LOOP_LIMIT);
            let step = |kb: usize, acc: &mut [f32; 8]| {
                for (j, a) in acc.iter_mut().enumerate() {
                    let s = f64::from(e8m0_to_f32(rows.scales[j][kb]));
                    *a += (block_sum(j, kb, &e2m1) * s) as f32;
                }
            };
            let scales = Scales::E8m0 {
                rows: std::array::from_fn(|j| &rows.scales[j][..]),
                limit: LOOP_LIMIT,
            };
            // SAFETY: `missing` found AVX2, FMA and F16C, or this trial is not run; the rows
            // and inputs hold LOOP_BLOCKS blocks.
            let run = |acc: &mut [f32; 8], blocks| unsafe {
                nibble_c1_run8(Codes::Fp4, acc, x, codes, scales, blocks)
            };
            loop_equals_steps(seed, leaves, step, run, (0.5, f32_bits))?;
            // The same rows as container Q4G (value `nibble − 8`), f16 scales in groups of
            // two blocks, one group in seven of one row infinite or NaN.
            const GROUP_BLOCKS: usize = 2;
            let f16_rows: Vec<Vec<u8>> = (0..8)
                .map(|j| {
                    (0..LOOP_BLOCKS / GROUP_BLOCKS)
                        .flat_map(|g| {
                            let bits = if (g as u64 + seed) % 7 == 3 && j as u64 == seed % 8 {
                                [0x7C00, 0xFE00][seed as usize % 2]
                            } else {
                                (next() % 2) << 15 | (next() % 31) << 10 | (next() % 1024)
                            };
                            (bits as u16).to_le_bytes()
                        })
                        .collect()
                })
                .collect();
            let f16_at = |j: usize, kb: usize| {
                let at = 2 * (kb / GROUP_BLOCKS);
                half::f16::from_le_bytes([f16_rows[j][at], f16_rows[j][at + 1]])
            };
            let q4 = |n: u8| f32::from(n) - 8.0;
            let leaves = |kb: usize| (0..8).any(|j| !f16_at(j, kb).is_finite());
            let step = |kb: usize, acc: &mut [f32; 8]| {
                for (j, a) in acc.iter_mut().enumerate() {
                    let s = f64::from(f16_at(j, kb).to_f32());
                    *a += (block_sum(j, kb, &q4) * s) as f32;
                }
            };
            let scales = Scales::F16 {
                rows: std::array::from_fn(|j| &f16_rows[j][..]),
                blocks_per_group: GROUP_BLOCKS,
            };
            // SAFETY: as above.
            let run = |acc: &mut [f32; 8], blocks| unsafe {
                nibble_c1_run8(Codes::Q4, acc, x, codes, scales, blocks)
            };
            loop_equals_steps(seed, leaves, step, run, (0.5, f32_bits))?;
            // The FP8 rows' bytes as container Q8G codes (signed bytes, −128 included), with
            // the same f16 scales: the word loop.
            let mut byte_inputs = ByteInputs::default();
            let Some(words) = byte_inputs.fill(&rows.x) else {
                return Err(format!("seed {seed}: no word form").into());
            };
            words
                .iter()
                .for_each(|b| splits[usize::from(b.is_split())] += 1);
            let q8_codes: [&[u8]; 8] = std::array::from_fn(|j| &rows.fp8[j][..]);
            let step = |kb: usize, acc: &mut [f32; 8]| {
                for (j, a) in acc.iter_mut().enumerate() {
                    let xb = rows.x[kb * BLOCK..][..BLOCK].try_into().expect("block");
                    let sum = exact(xb, |k| f32::from(rows.fp8[j][kb * BLOCK + k] as i8));
                    *a += (sum * f64::from(f16_at(j, kb).to_f32())) as f32;
                }
            };
            // SAFETY: as above.
            let run = |acc: &mut [f32; 8], blocks| unsafe {
                q8_c1_run8(acc, words, q8_codes, scales, blocks)
            };
            loop_equals_steps(seed, leaves, step, run, (0.5, f32_bits))?;
        }
        if counts[1..].contains(&0) || splits.contains(&0) {
            return Err(format!(
                "blocks by digit count {counts:?}, by word passes {splits:?}: one never ran"
            )
            .into());
        }
        Ok(())
    }

    /// Eight rows of one block for the AVX-512 trials: scales from 2^−127 to 2^118, every
    /// e4m3 code at every row and column across the seeds (NaN codes kept in one seed of
    /// four), every e2m1 nibble likewise.
    struct EightRows {
        s: [f64; 8],
        fp8: [[u8; BLOCK]; 8],
        fp4: [[u8; BLOCK / 2]; 8],
    }

    fn eight_rows(seed: u64, random: u32) -> EightRows {
        let scale_bytes: [u8; 8] = std::array::from_fn(|j| match (seed as usize + j) % 5 {
            0 => 0,
            1 => 245,
            _ => 90 + ((random as usize + 7 * j) % 60) as u8,
        });
        EightRows {
            s: scale_bytes.map(|b| f64::from(e8m0_to_f32(b))),
            fp8: std::array::from_fn(|j| {
                std::array::from_fn(|k| {
                    let c = (k as u64 * 8 + j as u64 * 37 + seed * 3) as u8;
                    if c & 0x7F == 0x7F && !seed.is_multiple_of(4) {
                        c ^ 1
                    } else {
                        c
                    }
                })
            }),
            fp4: std::array::from_fn(|j| {
                std::array::from_fn(|b| (b as u64 * 17 + j as u64 * 5 + seed * 11) as u8)
            }),
        }
    }
}
