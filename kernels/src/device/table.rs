//! The chunk table of a device batch: [`Entry`] is `PPChunk` of
//! `kernels/cuda/pushpull_table.cuh`, field for field (a test compares the layouts through the
//! host twin), and [`Step`] names the table kernels (`pp_t_*` of `pushpull_kernels.cu`), one
//! launch each over every chunk of a table. [`Launch::of`] sizes a step's grid from the
//! entries: the x-dimension covers the largest chunk's work units (capped by the device), the
//! y-dimension is the chunk.

use crate::cuda::scheme::{num_buckets, num_pieces, pack_tile_capacity, GROUP, REDUCE_BLOCK, SPAN};

/// `PP_SCHEME_*`: a chunk's wire format in [`Entry::scheme`].
pub mod scheme {
    /// Raw fp32 (uncompressed, or below `min_compress_bytes`).
    pub const RAW: u32 = 0;
    /// IEEE binary16.
    pub const FP16: u32 = 1;
    /// bfloat16.
    pub const BF16: u32 = 2;
    /// Scale and sign bits.
    pub const ONEBIT: u32 = 3;
    /// Per-bucket (min, max) and b-bit codes.
    pub const MINMAX: u32 = 4;
    /// Packed QSGD dithering.
    pub const DITHER: u32 = 5;
    /// k values at keyed indices.
    pub const RANDOMK: u32 = 6;
}

/// `PP_OPT_*`: bits of [`Entry::opts`].
pub mod opt {
    /// onebit: the scale is mean |x|.
    pub const SCALING: u32 = 1;
    /// dithering: natural levels.
    pub const NATURAL: u32 = 2;
    /// dithering: l2 norm.
    pub const L2: u32 = 4;
    /// error feedback: vanilla (else corrected, with [`super::Entry::factor`]).
    pub const VANILLA: u32 = 8;
    /// decoding: divide by [`super::Entry::divisor`].
    pub const AVERAGE: u32 = 16;
}

/// One chunk of a batch (`PPChunk`). Addresses are device addresses (host addresses on the
/// emulated device); 0 means absent.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Entry {
    /// The gradient: `n` f32.
    pub g: u64,
    /// The codec's input: `ep` with error feedback, else `mp` with momentum, else `g`.
    pub x: u64,
    /// Where a pulled result is decoded: `n` f32.
    pub y: u64,
    /// Elements.
    pub n: u64,
    /// The payload (4-byte words).
    pub payload: u64,
    /// The chunk's [`super::flag::WORDS`] check words (8-byte aligned).
    pub flags: u64,
    /// Momentum `m`.
    pub m: u64,
    /// The next momentum `mu * m + g` (kept if the round succeeds).
    pub m_next: u64,
    /// Momentum's output `g + mu * m_next`.
    pub mp: u64,
    /// The error-feedback residual `e`.
    pub e: u64,
    /// Error feedback's output (the codec input) `input + e`.
    pub ep: u64,
    /// The new residual `ep - D(C(ep))` (kept if the round succeeds).
    pub d: u64,
    /// f64 block partials (onebit, l2 dithering).
    pub partials: u64,
    /// f32 span partials, two per span (minmax, max-norm dithering).
    pub spans: u64,
    /// Elements per bucket.
    pub bucket: u64,
    /// Random-k's values.
    pub k: u64,
    /// This round's rounding stream base.
    pub rounding: u64,
    /// This round's random-k index stream base.
    pub indices: u64,
    /// [`scheme`].
    pub scheme: u32,
    /// minmax: bits; dithering: levels s.
    pub param: u32,
    /// [`opt`] bits.
    pub opts: u32,
    /// Zero.
    pub pad: u32,
    /// Nesterov's mu.
    pub mu: f32,
    /// Corrected error feedback's `η_{t−1} / η_t`.
    pub factor: f32,
    /// Random-k's value scale.
    pub scale: f32,
    /// The number of workers, for [`opt::AVERAGE`].
    pub divisor: f32,
}

/// Bytes of one [`Entry`] (`sizeof(PPChunk)`).
pub const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();

/// The bytes of a table, as the kernels read it.
pub fn table_bytes(entries: &[Entry]) -> &[u8] {
    // SAFETY: `Entry` is `repr(C)` of u64, u32 and f32 fields with no padding (176 bytes, a
    // multiple of its 8-byte alignment; `chunk_layout_matches_the_header` checks every offset),
    // so every byte is initialised.
    unsafe {
        std::slice::from_raw_parts(
            entries.as_ptr().cast::<u8>(),
            std::mem::size_of_val(entries),
        )
    }
}

/// A table kernel. The discriminant is the step number of the host twin
/// (`pp_emu_table_step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Step {
    /// `pp_t_clear`: every chunk's flags reset (one thread per chunk, one-dimensional).
    Clear = 0,
    /// `pp_t_prepare`: momentum, error feedback, the non-finite check.
    Prepare = 1,
    /// `pp_t_stats`: onebit's signs and partials, min/max spans, l2 partials.
    Stats = 2,
    /// `pp_t_finalize`: the payload headers.
    Finalize = 3,
    /// `pp_t_encode`: the codes (casts, bit streams, random-k's values, raw copies).
    Encode = 4,
    /// `pp_t_residual`: error feedback's new residual.
    Residual = 5,
    /// `pp_t_residual_scatter`: random-k's residual on its support.
    ResidualScatter = 6,
    /// `pp_t_decode`: pulled payloads into the output.
    Decode = 7,
    /// `pp_t_decode_scatter`: random-k's pulled values.
    DecodeScatter = 8,
}

impl Step {
    /// The compression steps, in launch order.
    pub const COMPRESS: [Step; 7] = [
        Step::Clear,
        Step::Prepare,
        Step::Stats,
        Step::Finalize,
        Step::Encode,
        Step::Residual,
        Step::ResidualScatter,
    ];
    /// The decoding steps, in launch order.
    pub const DECODE: [Step; 2] = [Step::Decode, Step::DecodeScatter];

    /// The kernel's entry point.
    pub fn kernel(self) -> &'static str {
        match self {
            Step::Clear => "pp_t_clear",
            Step::Prepare => "pp_t_prepare",
            Step::Stats => "pp_t_stats",
            Step::Finalize => "pp_t_finalize",
            Step::Encode => "pp_t_encode",
            Step::Residual => "pp_t_residual",
            Step::ResidualScatter => "pp_t_residual_scatter",
            Step::Decode => "pp_t_decode",
            Step::DecodeScatter => "pp_t_decode_scatter",
        }
    }
}

/// Threads per block of every table launch.
pub const THREADS: u64 = 256;

/// One launch of a step over a table: blocks per chunk in x (before the device's cap) and the
/// dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// The kernel.
    pub step: Step,
    /// Blocks in x: the most any chunk needs (the kernels loop grid-stride, so a device may
    /// launch fewer).
    pub blocks: u64,
    /// Dynamic shared memory in bytes (the pack tiles of `Encode`).
    pub shared_bytes: u32,
}

impl Launch {
    /// The launch of `step` over `entries`, or `None` when no chunk has work in it.
    pub fn of(step: Step, entries: &[Entry]) -> Option<Launch> {
        let per_block = |units: u64| units.div_ceil(THREADS);
        let warps = THREADS / 32;
        let mut blocks = 0u64;
        let mut shared = 0u64;
        if step == Step::Clear {
            blocks = per_block(entries.len() as u64);
        }
        for c in entries {
            let n = c.n;
            let bucket = c.bucket.max(1);
            let ef = c.e != 0;
            let need = match (step, c.scheme) {
                (Step::Clear, _) => 0,
                (Step::Prepare, _) => per_block(n),
                (Step::Stats, scheme::ONEBIT) => {
                    num_pieces(n, n.max(1), REDUCE_BLOCK).div_ceil(warps)
                }
                (Step::Stats, scheme::MINMAX) => num_pieces(n, bucket, SPAN).div_ceil(warps),
                (Step::Stats, scheme::DITHER) if c.opts & opt::L2 != 0 => {
                    num_pieces(n, bucket, REDUCE_BLOCK).div_ceil(warps)
                }
                (Step::Stats, scheme::DITHER) => num_pieces(n, bucket, SPAN).div_ceil(warps),
                (Step::Finalize, scheme::ONEBIT) => 1,
                (Step::Finalize, scheme::MINMAX | scheme::DITHER) => {
                    let nb = num_buckets(n as usize, bucket as usize) as u64;
                    let unit = if c.scheme == scheme::DITHER && c.opts & opt::L2 != 0 {
                        REDUCE_BLOCK
                    } else {
                        SPAN
                    };
                    if bucket.div_ceil(unit) > 256 {
                        nb
                    } else {
                        per_block(nb)
                    }
                }
                (Step::Encode, scheme::RAW | scheme::FP16 | scheme::BF16) => per_block(n),
                (Step::Encode, scheme::MINMAX | scheme::DITHER) => {
                    let w = code_width(c);
                    if !direct_width(w) {
                        shared = shared.max(4 * pack_tile_capacity(w));
                    }
                    per_block((n * w as u64).div_ceil(32))
                }
                (Step::Encode, scheme::RANDOMK) => per_block(c.k),
                (Step::Residual, _) if ef => per_block(n.div_ceil(GROUP)),
                (Step::ResidualScatter, scheme::RANDOMK) if ef => per_block(c.k),
                (Step::Decode, _) => per_block(n.div_ceil(GROUP)),
                (Step::DecodeScatter, scheme::RANDOMK) => per_block(c.k),
                _ => 0,
            };
            blocks = blocks.max(need);
        }
        (blocks > 0).then_some(Launch {
            step,
            blocks,
            shared_bytes: shared as u32,
        })
    }
}

/// The code width of a bit-stream entry (`pp_chunk_width`).
fn code_width(c: &Entry) -> u32 {
    match c.scheme {
        scheme::ONEBIT => 1,
        scheme::MINMAX => c.param,
        scheme::DITHER => 1 + (32 - c.param.leading_zeros()),
        _ => 0,
    }
}

/// `pp_direct_width`: widths whose words the pack kernels fill without shared memory.
fn direct_width(w: u32) -> bool {
    w <= 8 && w.is_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_layout_matches_the_header() {
        let mut offs = [0u64; 32];
        // SAFETY: writes at most offs.len() values.
        let count =
            unsafe { crate::cuda::host::ffi::pp_host_chunk_layout(offs.as_mut_ptr(), 32) } as usize;
        let e = Entry::default();
        let base = &e as *const Entry as usize;
        let at = |p: *const u8| (p as usize - base) as u64;
        let ours = [
            ENTRY_BYTES as u64,
            at(&e.g as *const u64 as *const u8),
            at(&e.x as *const u64 as *const u8),
            at(&e.y as *const u64 as *const u8),
            at(&e.n as *const u64 as *const u8),
            at(&e.payload as *const u64 as *const u8),
            at(&e.flags as *const u64 as *const u8),
            at(&e.m as *const u64 as *const u8),
            at(&e.m_next as *const u64 as *const u8),
            at(&e.mp as *const u64 as *const u8),
            at(&e.e as *const u64 as *const u8),
            at(&e.ep as *const u64 as *const u8),
            at(&e.d as *const u64 as *const u8),
            at(&e.partials as *const u64 as *const u8),
            at(&e.spans as *const u64 as *const u8),
            at(&e.bucket as *const u64 as *const u8),
            at(&e.k as *const u64 as *const u8),
            at(&e.rounding as *const u64 as *const u8),
            at(&e.indices as *const u64 as *const u8),
            at(&e.scheme as *const u32 as *const u8),
            at(&e.param as *const u32 as *const u8),
            at(&e.opts as *const u32 as *const u8),
            at(&e.pad as *const u32 as *const u8),
            at(&e.mu as *const f32 as *const u8),
            at(&e.factor as *const f32 as *const u8),
            at(&e.scale as *const f32 as *const u8),
            at(&e.divisor as *const f32 as *const u8),
        ];
        assert_eq!(count, ours.len(), "PPChunk has another number of fields");
        assert_eq!(
            &offs[..count],
            &ours[..],
            "PPChunk's layout (size, then offsets)"
        );
        assert_eq!(ENTRY_BYTES, 176);
    }

    #[test]
    fn steps_name_kernels_of_the_source() {
        for step in Step::COMPRESS.iter().chain(&Step::DECODE) {
            let name = format!("__global__ void {}(", step.kernel());
            assert!(crate::cuda::SOURCE.contains(&name), "{name}");
        }
    }

    #[test]
    fn launches_cover_the_largest_chunk_and_skip_idle_steps() {
        let fp16 = Entry {
            n: 1000,
            bucket: 1000,
            scheme: scheme::FP16,
            ..Entry::default()
        };
        let minmax3 = Entry {
            n: 70_000,
            bucket: 512,
            scheme: scheme::MINMAX,
            param: 3,
            ..Entry::default()
        };
        let t = [fp16, minmax3];
        assert_eq!(Launch::of(Step::Prepare, &t).unwrap().blocks, 274);
        let enc = Launch::of(Step::Encode, &t).unwrap();
        assert_eq!(enc.blocks, (70_000u64 * 3).div_ceil(32).div_ceil(256));
        assert_eq!(enc.shared_bytes as u64, 4 * pack_tile_capacity(3));
        // No error feedback, no random-k: nothing to do in those steps.
        assert_eq!(Launch::of(Step::Residual, &t), None);
        assert_eq!(Launch::of(Step::ResidualScatter, &t), None);
        assert_eq!(Launch::of(Step::DecodeScatter, &t), None);
        // fp16 has no statistics; minmax's 35 spans (buckets of 512) take 5 blocks of 8 warps.
        assert_eq!(
            Launch::of(Step::Stats, &t).unwrap().blocks,
            137u64.div_ceil(8)
        );
        assert_eq!(Launch::of(Step::Clear, &t).unwrap().blocks, 1);
        assert_eq!(Launch::of(Step::Clear, &[]), None);
    }
}
