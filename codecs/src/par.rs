//! When and how the kernels split work across rayon threads.
//!
//! Every parallel path cuts the input at fixed element offsets (multiples of [`SEG`], which is
//! a multiple of 32 and of [`crate::elem::REDUCE_BLOCK`]) and combines partial results in a
//! fixed order, so its output is bit-identical to the serial path's whatever the thread count.
//! The kernels use rayon's *current* pool: run a compressor inside
//! `rayon::ThreadPool::install` to bound the threads it uses (one thread gives the serial path).

/// Elements per parallel work item (a multiple of 32 and of 256).
pub(crate) const SEG: usize = 1 << 15;

/// Below this many elements every kernel runs serially.
pub(crate) const PAR_MIN: usize = 1 << 17;

/// Whether a kernel over `n` elements should go parallel.
#[inline]
pub(crate) fn enabled(n: usize) -> bool {
    n >= PAR_MIN && rayon::current_num_threads() > 1
}
