//! What this machine can do, measured in the same run as the model: read bandwidth (a plain
//! summing loop over a buffer far larger than the caches, on the current thread pool) and the
//! rates of f64 and f32 multiply-adds this build reaches (many independent chains, as the
//! kernels run them, at the widest vector level the kernels use: on a CPU with two 512-bit FMA
//! units a 256-bit loop reaches half). Best of a few repetitions, so a busy moment on a shared
//! machine does not set the floor.

use std::time::Instant;

use ds41_engine::model::simd;
use rayon::prelude::*;

/// Least bytes of the buffer the bandwidth loop reads, and how many times the largest cache it
/// is at least (some server CPUs have a last-level cache of hundreds of MiB).
const BANDWIDTH_BYTES: usize = 512 << 20;
const CACHES_OVER: usize = 4;
const REPS: usize = 3;

/// The largest cache of CPU 0, from sysfs (0 where it is not known).
fn largest_cache_bytes() -> usize {
    let Ok(dirs) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return 0;
    };
    dirs.filter_map(|d| std::fs::read_to_string(d.ok()?.path().join("size")).ok())
        .filter_map(|size| {
            let size = size.trim();
            let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
            let scale = match unit {
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                _ => return None,
            };
            digits.parse::<usize>().ok()?.checked_mul(scale)
        })
        .max()
        .unwrap_or(0)
}

/// Read bandwidth in bytes per second.
pub fn read_bandwidth() -> f64 {
    let bytes = BANDWIDTH_BYTES.max(CACHES_OVER * largest_cache_bytes());
    let words = bytes / 8;
    // Distinct values, so no page is shared and nothing is folded away.
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(rayon::current_num_threads().max(1) * 4);
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..REPS {
        let t = Instant::now();
        sink ^= buf
            .par_chunks(chunk)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u64::wrapping_add);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    (words * 8) as f64 / best
}

/// The float width of a multiply-add rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Float {
    /// What rule C2's chains and the decode kernels' block sums run on.
    F64,
    /// Twice the lanes per vector: the fastest float multiply-add the machine has, so a bound
    /// on any float form of a prefill.
    F32,
}

/// Multiply-adds per second over all threads of the pool, in `float`: enough independent
/// chains (several vector registers' worth) that the FMA units, not the latency of one chain,
/// bound the rate; at the vector level the kernels run with ([`simd::level`]).
pub fn multiply_add_rate(float: Float) -> f64 {
    let threads = rayon::current_num_threads().max(1);
    let mut best = f64::INFINITY;
    for _ in 0..REPS {
        let t = Instant::now();
        let (s, done): (f64, usize) = (0..threads)
            .into_par_iter()
            .map(|i| {
                let x = std::hint::black_box(1.000_000_1 + i as f64 * 1e-9);
                match (simd::level(), float) {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `level` reports Avx512 or above only where the CPU has AVX-512 F.
                    (l, Float::F64) if l >= simd::Level::Avx512 => unsafe { chains_avx512_f64(x) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    (l, Float::F32) if l >= simd::Level::Avx512 => unsafe { chains_avx512_f32(x) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `level` reports Avx2 or above only where the CPU has AVX2 and FMA.
                    (l, Float::F64) if l >= simd::Level::Avx2 => unsafe { chains_fma_f64(x) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as above.
                    (l, Float::F32) if l >= simd::Level::Avx2 => unsafe { chains_fma_f32(x) },
                    (_, Float::F64) => chains::<f64>(x),
                    (_, Float::F32) => chains::<f32>(x),
                }
            })
            .reduce(|| (0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        std::hint::black_box(s);
        best = best.min(t.elapsed().as_secs_f64() / done as f64);
    }
    1.0 / best
}

const CHAINS: usize = 64;
const STEPS: usize = 1 << 21;

/// A function running `$regs` vector registers of chains `acc = fma(acc, x, step)` for
/// [`STEPS`] steps with the given intrinsics; returns the sum and the multiply-adds done.
/// 512-bit: sixteen registers, enough to keep two FMA units busy through their latency.
/// 256-bit: twelve (two FMA units of latency four need eight in flight; sixteen would leave no
/// register for the factors, and the compiler's spills of an array of chains measured a third
/// of the peak).
#[cfg(target_arch = "x86_64")]
macro_rules! fma_chains {
    ($name:ident, $features:literal, $float:ty, $lanes:literal, $regs:literal,
     $set1:ident, $zero:ident, $fmadd:ident, $store:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(x: f64) -> (f64, usize) {
            use std::arch::x86_64::*;
            let (xv, step) = ($set1(x as $float), $set1(1e-9));
            let mut acc = [$zero(); $regs];
            for _ in 0..STEPS {
                for a in &mut acc {
                    *a = $fmadd(*a, xv, step);
                }
            }
            let mut total = 0.0;
            for a in acc {
                let mut lanes = [0.0 as $float; $lanes];
                $store(lanes.as_mut_ptr(), a);
                total += lanes.iter().map(|&l| f64::from(l)).sum::<f64>();
            }
            (total, $regs * $lanes * STEPS)
        }
    };
}

#[cfg(target_arch = "x86_64")]
fma_chains!(
    chains_avx512_f64,
    "avx512f",
    f64,
    8,
    16,
    _mm512_set1_pd,
    _mm512_setzero_pd,
    _mm512_fmadd_pd,
    _mm512_storeu_pd
);
#[cfg(target_arch = "x86_64")]
fma_chains!(
    chains_avx512_f32,
    "avx512f",
    f32,
    16,
    16,
    _mm512_set1_ps,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_storeu_ps
);
#[cfg(target_arch = "x86_64")]
fma_chains!(
    chains_fma_f64,
    "avx2,fma",
    f64,
    4,
    12,
    _mm256_set1_pd,
    _mm256_setzero_pd,
    _mm256_fmadd_pd,
    _mm256_storeu_pd
);
#[cfg(target_arch = "x86_64")]
fma_chains!(
    chains_fma_f32,
    "avx2,fma",
    f32,
    8,
    12,
    _mm256_set1_ps,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_storeu_ps
);

/// The baseline's chains (no fused multiply-add). Returns the sum and the multiply-adds done.
fn chains<F>(x: f64) -> (f64, usize)
where
    F: Copy + From<f32> + Into<f64> + std::ops::Mul<Output = F> + std::ops::Add<Output = F>,
{
    let x = F::from(x as f32);
    let step = F::from(1e-9);
    let mut acc = [F::from(0.0); CHAINS];
    for _ in 0..STEPS {
        for a in &mut acc {
            *a = *a * x + step;
        }
    }
    (acc.iter().map(|&a| a.into()).sum::<f64>(), CHAINS * STEPS)
}
