//! When a loop is worth handing to the thread pool.
//!
//! Handing work to rayon's pool from outside it costs a wake-up and a context switch each way
//! (tens of microseconds on a busy machine), more than a small model's linears, attention rows
//! or index scores take; decode on a dim-128 model spent most of its time there. Loops below
//! [`MIN_PARALLEL_WORK`] units of work (multiply-adds, or the weight bytes a product reads
//! where those are more), or with a one-thread pool, run in order on the calling thread.
//! Every loop here writes disjoint outputs with the same arithmetic either way, so results do
//! not depend on the choice (nor on the thread count).

use rayon::prelude::*;

/// Multiply-adds below which a loop runs on the calling thread: at the kernels' rate a
/// million take a hundred-odd microseconds, about what a hand-off to a sleeping worker
/// costs on a busy virtual machine. At a quarter of that, a dim-128 model's index scores
/// went to the pool from 512 keys on and its decode ran ~25% slower on two threads than on
/// one (`ds41 bench`, 1,500 tokens).
pub(crate) const MIN_PARALLEL_WORK: usize = 1 << 20;

/// Is a loop of about `work` multiply-adds worth the pool?
pub(crate) fn worth_parallel(work: usize) -> bool {
    work >= MIN_PARALLEL_WORK && rayon::current_num_threads() > 1
}

/// `task(index, chunk)` over the `size`-element chunks of `out`, on the pool when `parallel`,
/// else in order on this thread; the first error ends the loop.
pub(crate) fn try_for_each_chunk<T: Send, E: Send>(
    out: &mut [T],
    size: usize,
    parallel: bool,
    task: impl Fn(usize, &mut [T]) -> Result<(), E> + Sync + Send,
) -> Result<(), E> {
    if parallel {
        out.par_chunks_mut(size)
            .enumerate()
            .try_for_each(|(i, c)| task(i, c))
    } else {
        out.chunks_mut(size)
            .enumerate()
            .try_for_each(|(i, c)| task(i, c))
    }
}

/// [`try_for_each_chunk`] for a task that cannot fail.
pub(crate) fn for_each_chunk<T: Send>(
    out: &mut [T],
    size: usize,
    parallel: bool,
    task: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let _ = try_for_each_chunk(out, size, parallel, |i, c| {
        task(i, c);
        Ok::<(), std::convert::Infallible>(())
    });
}
