//! What this machine can do, measured in the same run as the model: read bandwidth (a plain
//! summing loop over a buffer far larger than the caches, on the current thread pool) and the
//! rate of f64 multiply-adds this build reaches (many independent chains, as the kernels run
//! them, at the widest vector level the kernels use: on a CPU with two 512-bit FMA units a
//! 256-bit loop reaches half). Best of a few repetitions, so a busy moment on a shared machine
//! does not set the floor.

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

/// f64 multiply-adds per second over all threads of the pool: enough independent chains
/// (several vector registers' worth) that the FMA units, not the latency of one chain, bound
/// the rate; at the vector level the kernels run with ([`simd::level`]).
pub fn multiply_add_rate() -> f64 {
    let threads = rayon::current_num_threads().max(1);
    let mut best = f64::INFINITY;
    for _ in 0..REPS {
        let t = Instant::now();
        let (s, done): (f64, usize) = (0..threads)
            .into_par_iter()
            .map(|i| {
                let x = std::hint::black_box(1.000_000_1 + i as f64 * 1e-9);
                match simd::level() {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `level` reports Avx512 or above only where the CPU has AVX-512 F.
                    l if l >= simd::Level::Avx512 => unsafe { chains_avx512(x) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `level` reports Avx2 or above only where the CPU has AVX2 and FMA.
                    l if l >= simd::Level::Avx2 => unsafe { chains_fma(x) },
                    _ => chains(x),
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

/// 512-bit chains: sixteen registers of eight, enough to keep two FMA units busy through
/// their latency. Returns the sum and the multiply-adds done.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512(x: f64) -> (f64, usize) {
    use std::arch::x86_64::*;
    let (xv, step) = (_mm512_set1_pd(x), _mm512_set1_pd(1e-9));
    let mut acc = [_mm512_setzero_pd(); 16];
    for _ in 0..STEPS {
        for a in &mut acc {
            *a = _mm512_fmadd_pd(*a, xv, step);
        }
    }
    let total = acc.iter().map(|&a| _mm512_reduce_add_pd(a)).sum();
    (total, 16 * 8 * STEPS)
}

/// 256-bit chains: twelve registers of four (two FMA units of latency four need eight in
/// flight; sixteen would leave no register for the factors, and the compiler's spills of an
/// array of chains measured a third of the peak). Returns the sum and the multiply-adds done.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_fma(x: f64) -> (f64, usize) {
    use std::arch::x86_64::*;
    let (xv, step) = (_mm256_set1_pd(x), _mm256_set1_pd(1e-9));
    let mut acc = [_mm256_setzero_pd(); 12];
    for _ in 0..STEPS {
        for a in &mut acc {
            *a = _mm256_fmadd_pd(*a, xv, step);
        }
    }
    let mut total = 0.0;
    for a in acc {
        let mut lanes = [0.0; 4];
        _mm256_storeu_pd(lanes.as_mut_ptr(), a);
        total += lanes.iter().sum::<f64>();
    }
    (total, 12 * 4 * STEPS)
}

/// The baseline's chains (no fused multiply-add). Returns the sum and the multiply-adds done.
fn chains(x: f64) -> (f64, usize) {
    let mut acc = [0.0f64; CHAINS];
    for _ in 0..STEPS {
        for a in &mut acc {
            *a = *a * x + 1e-9;
        }
    }
    (acc.iter().sum::<f64>(), CHAINS * STEPS)
}
