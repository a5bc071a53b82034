//! Gradient compression for pushpull, on the CPU: every compressor of the seeds, the chain
//! that adds error feedback and momentum to any of them, the registry that builds them from a tensor's string
//! map, and the reduction. Nothing here touches a GPU or a socket: the scheduler and the
//! servers depend on this crate alone; `pushpull-kernels` adds the device (CUDA, and its
//! host-compiled twin) on top, with the same bytes.
//!
//! # Map of the crate
//!
//! | module | what |
//! |---|---|
//! | (root) | [`NodeIdentity`], [`RoundCtx`], re-exports |
//! | [`codec`] | the [`Codec`] trait (a wire format bound to a chunk: encode, decode or decode-add) and [`CodecInfo`] (what it states as data: name, length, payload size, random-draw coordinates) |
//! | [`chain`] | [`Compressor`]: a codec with error feedback and Nesterov momentum where configured, owning all the state (residual, momentum, undo, checkpoint); the fused fast paths, chosen by the codec's type when the chain is built |
//! | [`chunk`] | [`chunk::low_rank_plan`] (which tensors PowerSGD compresses and the tensors its P and Q are summed as); the codec plug-in: [`CodecFactory`] and its [`CodecContext`] (which tensor, chunk and [`Node`]), [`KernelsFactory`] (the default) and [`chunk_codec`], with which workers, servers and the reference build a chunk's chain the same way; [`chunk::tensor_cut`], the one cut of a tensor the scheduler and the reference place with; [`Fp32Factory`], [`fp32_codec`] |
//! | [`spec`] | what a compressor brings to the registry: its [`Entry`] (name, keys, parse), its parsed settings ([`CodecSpec`], which build its codec), the resolved map its parse reads ([`Keys`]), [`KSpec`], [`BuildOptions`], [`Purpose`] |
//! | [`params`] | [`CompressorSpec`] (a parsed map: the compressor's settings and the chain's) and each compressor's settings type; the chain's and shared keys [`KEYS`] |
//! | [`registry`] | every compressor by name in one table ([`COMPRESSORS`]); [`parse_params`], [`all_keys`], [`overlay_params`], [`build_compressor`], [`build_from_spec`] |
//! | [`gossip`] | decentralised averaging, the pure part of Moniqua's Algorithm 1: the mixing matrix [`gossip::Mixing`] (symmetric, doubly stochastic, spectral gap below 1, each refusal named) and one worker's [`gossip::average_step`] |
//! | [`reduce`] | the reduction, defined once: [`RankOrderSum`] (servers and the reference), [`host_fold`] and [`IntraCodec`] (a local group's host sum: its members and the reference) and [`average`] (workers, the reference; the device's decode matches it) |
//! | [`error`] | [`KernelError`] |
//! | [`rng`] | the counter-based generator: rounding streams, random-k permutations |
//! | [`elem`] | per-element math and fixed-order reductions: the definition every path follows |
//! | [`bench`](mod@bench) | the throughput table (GB/s and ratio to memcpy) that `codecs/examples/bench_compress.rs` prints |
//! | [`payload`] | the payload checks the device's decoders share with the codecs' |
//! | `codecs` (private) | one module per compressor: its [`Entry`], settings and parse beside its [`Codec`] (and a chain fast path where it has one); the bit-stream machinery they share |
//! | `simd`, `par`, `stats` (private) | run-time CPU dispatch ([`SimdLevel`]) and the vector building blocks the codecs share; the fixed-offset splits over rayon's pool; per-bucket statistics with non-finite detection fused in |
//!
//! # The traits and the chain
//! A [`Codec`] is a wire format bound to one chunk (one key) of `len` elements: it encodes
//! ([`Codec::encode`], one round per call) and decodes a payload into the chunk or adds it to
//! an accumulator ([`Codec::decode`]; adding is bit for bit what decoding followed by
//! `acc[i] += v[i]` gives, so a server can sum pushes without a temporary). It keeps no state.
//! A [`Compressor`] is the chain around it: error feedback and Nesterov momentum where
//! configured, their state, and the length checks; nodes hold one per chunk.
//!
//! The registry builds `nesterov(ef(codec))`: momentum on workers only (a server built from the
//! same map skips it), error feedback wherever configured. A worker compresses
//! its gradient and decompresses the pulled sum with the same instance; a server
//! decompress-adds every push (in rank order) and compresses the sum with its own instance
//! (built with [`Role::Server`]).
//!
//! ```
//! use pushpull_codecs::{build_compressor, NodeIdentity, RoundCtx};
//! let params = [("byteps_compressor_type", "topk"), ("byteps_compressor_k", "3"),
//!               ("byteps_error_feedback_type", "vanilla")]
//!     .iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
//! let mut c = build_compressor(&params, 8, &NodeIdentity::worker(42, 7, 0)).unwrap();
//! assert_eq!(c.name(), "ef(vanilla, topk(k=3))");
//! let mut payload = Vec::new();
//! c.compress(&[0.1, -5.0, 0.2, 3.0, 0.0, 4.0, -0.3, 0.05], &RoundCtx::new(0), &mut payload).unwrap();
//! let mut sum = vec![0.0; 8];
//! c.decompress_add(&payload, &RoundCtx::new(0), &mut sum).unwrap();
//! assert_eq!(sum, [0.0, -5.0, 0.0, 3.0, 0.0, 4.0, 0.0, 0.0]);
//! ```
//!
//! # Parameter keys
//! Keys and values are matched exactly (case-sensitive). Every problem is a [`KernelError`]
//! naming the key as spelled, the value and what is allowed; keys that do not apply to the
//! chosen compressor and two spellings of one key with different values are errors too.
//!
//! | key | aliases (BytePS) | applies to | values | default |
//! |---|---|---|---|---|
//! | `compressor` | `byteps_compressor_type` | all | `none`, `fp16`, `bf16`, `onebit`, `topk`, `randomk`, `dithering`, `minmax`, `moniqua`, `powersgd` | `none` |
//! | `k` | `byteps_compressor_k` | topk, randomk | a fraction in (0, 1) of the chunk (topk: ≤ 0.5) or a whole count ≥ 1 per chunk (topk: ≤ len/2, randomk: ≤ len) | required |
//! | `k` | `byteps_compressor_k` | dithering | the number of levels s: 1..=32767 (linear), 1..=32 (natural) | required |
//! | `scaling` | `byteps_compressor_onebit_scaling` | onebit | `true`, `false` | `false` |
//! | `columns` | | onebit | a whole number ≥ 1: the tensor's column count, column-major (a column is `len / C` contiguous elements; C divides the length); selects the column-wise variant, cut at column boundaries | absent |
//! | `unbiased` | | randomk | `true`, `false` (scale by n/k on workers) | `false` |
//! | `partition` | `byteps_dithering_partition` | dithering | `linear` or `0`, `natural` or `1` | `linear` |
//! | `normalize` | `byteps_dithering_normalize` | dithering | `max` or `0`, `l2` or `1` | `max` |
//! | `encoding` | | dithering | `packed`, `elias` (or `elias_gamma`: Elias gamma codes), `elias_omega` (Elias omega, the recursive code of QSGD's paper) | `packed` |
//! | `bucket` | | dithering, minmax | elements per bucket, ≥ 1 (QSGD uses 512) | the whole chunk |
//! | `bits` | | minmax, moniqua | 1..=8 (moniqua with stochastic rounding: 2..=8, δ < ½) | `8` |
//! | `theta` | | moniqua | θ, a finite number > 0 | required |
//! | `rounding` | | moniqua | `stochastic` (δ = 2^-bits), `nearest` (δ = 2^-(bits+1)) | `stochastic` |
//! | `hash` | | moniqua | `true` (8 more bytes a message: the hash of its un-modded values, checked by the receiver, which fails the round when its recovery differs, i.e. when the models are more than θ apart), `false` | `false` |
//! | `theta_schedule` | | moniqua | `fixed`, `lr` (θ is `theta` × the round's learning rate, [`RoundCtx::lr`], which must be set: the paper's θ ∝ α) | `fixed` |
//! | `rows` | | powersgd | the tensor's first dimension, a divisor of its length (the matrix is rows × len/rows, row-major) | required |
//! | `rank` | `matrix_approximation_rank` | powersgd | 1..=min(rows, cols) of each matrix it compresses | `1` |
//! | `start_iter` | `start_powerSGD_iter` | powersgd | steps summed uncompressed first | `1000` |
//! | `min_compression_rate` | | powersgd | compress where rows·cols > rate·(rows + cols)·rank; > 0 | `2` |
//! | `use_error_feedback` | | powersgd | `true`, `false` | `true` |
//! | `warm_start` | | powersgd | `true` (Q from the previous step), `false` | `true` |
//! | `orthogonalization_epsilon` | | powersgd | ≥ 0, added to each column's norm | `0` |
//! | `ef` | `byteps_error_feedback_type`, `byteps_ef_type` | all | `none`, `vanilla`, `corrected` | `none` |
//! | `momentum` | `byteps_momentum_type` | all (workers only) | `none`, `nesterov` | `none` |
//! | `mu` | `byteps_momentum_mu` | momentum=nesterov | a number in [0, 1) | `0.9` |
//! | `intra_compressor` | | all (local groups, `cluster.local_size` > 1) | `none`, `fp16`, `bf16`: each member's gradient rounded to it and back before the host sum | `none` |
//! | `seed` | `byteps_seed` | all | a u64 replacing the job seed for this tensor | the job seed |
//!
//! Booleans are `true`/`false` only. With `momentum=nesterov` the training code's own optimizer
//! momentum must be 0 (dist-EF-SGDM adds momentum before compression).
//!
//! ## k when a tensor spans several chunks
//! Each chunk is compressed on its own. A fraction `k < 1` gives `max(1, floor(k·len))` for every
//! chunk. A count `k >= 1` is per chunk: it is validated against the tensor's full chunk length
//! (topk: `k <= len/2`, randomk: `k <= len`) and every full-size chunk keeps `k`; a shorter last
//! chunk keeps the same proportion, `ceil(k · len_last / len_full)` (see
//! [`KSpec::chunk_k`] and [`BuildOptions::full_chunk_len`]). [`build_compressor`]
//! treats the chunk it is given as full-size.
//!
//! # Wire formats
//! Little-endian everywhere. A *bit stream of n codes of w bits* puts code `i` at stream bits
//! `[i·w, i·w + w)`, stream bit `j` being bit `j % 32` of u32 word `j / 32`, padded with zero
//! bits to whole words: `4·ceil(n·w/32)` bytes ([`stream_bytes`]). Buckets start at multiples
//! of `bucket`; `nb = ceil(n / bucket)` (0 when n = 0); reductions restart at each bucket.
//! Element `i` rounds with `Stream::rounding(seed, key, round, role, rank).uniform(i)`: a 16-bit
//! uniform, lane `i % 4` of draw `i / 4` (protocol version 3; [`rng`] states the `2^-16`-of-a-step
//! bias bound), and minmax/dithering multiply by per-bucket reciprocals ([`elem::bucket_factor`]).
//!
//! | compressor | payload | size (bytes) |
//! |---|---|---|
//! | `none` | n f32 | `4n` |
//! | `fp16`, `bf16` | n u16 from [`elem::f32_to_f16_sat`] / [`elem::f32_to_bf16_sat`] | `2n` |
//! | `onebit` | f32 scale (`elem::mean_abs` if scaling, else 1), bit stream of n sign bits (set for x < 0) | `4 + 4·ceil(n/32)` |
//! | `onebit` + `columns=C` | min(C, n) × (f32 mean of the column's x ≥ 0, f32 mean of its x < 0), n sign bits | `8·min(C,n) + 4·ceil(n/32)` |
//! | `topk` | k u32 indices (strictly increasing), then k f32 values | `8k` |
//! | `randomk` | k f32 values `x[idx_j]·scale`, `idx_j = Permutation(n, Stream::indices(seed, key, round)).permute(j)` | `4k` |
//! | `dithering`, packed | nb f32 norms, bit stream of n codes `(level << 1) \| sign`, `w = 1 + bitlen(s)` | `4·nb + 4·ceil(n·w/32)` |
//! | `dithering`, elias | u32 count m of non-zero levels, nb f32 norms, (gap, sign, level) triples, gap and level Elias gamma (`elias`) or omega (`elias_omega`) coded | at most `4 + 4·nb + 4·ceil(n·b/32)`, `b = 3 + 2·floor(log2 s)` (gamma), `2 + max(\|omega(l)\|, l ≤ s)` (omega) |
//! | `minmax` | nb × (f32 min, f32 max), bit stream of n codes of b bits | `8·nb + 4·ceil(n·b/32)` |
//! | `moniqua` | bit stream of n codes of b bits of `(x/B_θ) mod 1`; then the sender's f64 `B_θ` with `theta_schedule = bound`; then a u64 hash of the un-modded values with `hash = true` | `4·ceil(n·b/32)`, + 8 with `bound`, + 8 with `hash` |
//! | `powersgd` | its own chunks: n f32 (the steps before `start_iter`, and tensors it leaves uncompressed); a low-rank step's P (and a bucket's uncompressed parts) and Q travel as two tensors of `none` ([`chunk::LowRankPlan::sum_tensors`]) | `4n`; a step `4·(rows + cols)·rank` per matrix |
//!
//! The exact definitions (which `elem` function computes what) are in each format's module
//! docs; the fixed-width ones (`none`, `fp16`, `bf16`, `onebit`, `randomk`, packed
//! `dithering`, `minmax`) are produced byte for byte by the CUDA kernels too. `topk`, Elias
//! `dithering`, column-wise `onebit` and `moniqua` are CPU only.
//! [`Compressor::max_compressed_len`] is the exact size for every fixed-size format and the
//! bound above for Elias (whose header carries its count). Notes:
//! * random-k draws **without replacement** (a keyed permutation), so no index repeats; the wire
//!   carries values only. A server ([`Role::Server`]) draws the same indices and never
//!   rescales, so the pulled sum equals the workers' `Σ D(C(g))` on the common support.
//! * minmax writes a zero min or max as `+0.0` ([`elem::canonical_zero`]).
//! * dithering: a level-0 element with its sign set decodes to `-0.0` (packed) or `+0.0` (Elias).
//!
//! # Randomness
//! [`rng`]: every draw is a pure function of its coordinates. Rounding uses
//! `(job seed, key, round, role, rank, element)`, so workers and the server round with
//! independent noise; random-k indices use `(seed, key, round, j)` only, identical everywhere.
//! One 64-bit draw feeds two elements. A run is reproducible from its seed.
//!
//! # Moniqua and its reference
//! [`RoundCtx::reference`] carries the reference on both sides: compress ignores it (checking
//! its length when given); decompress and decompress-add require it (the receiver's own copy,
//! within θ of the sender's values). Building Moniqua for gradient push_pull is refused
//! ([`Purpose::Gradient`], what [`build_compressor`] uses); a tensor whose map says
//! `exchange = "gossip"` is built with [`Purpose::ModelAveraging`] ([`chunk::chunk_codec`]),
//! and [`gossip`] averages the decoded messages.
//!
//! # Errors, non-finite input, overflow
//! No map, payload or length panics. NaN or ±Inf input is refused with the index of the first
//! one ([`KernelError::NonFinite`]) before any state changes; finite input whose statistics
//! overflow f32 (minmax `max - min`, an l2 norm, a linear dithering `norm·s`, a random-k
//! `x·n/k`, error feedback's `g + e`) is refused with [`KernelError::Overflow`]; fp16/bf16
//! saturate. Payloads are validated (length, header, indices, levels, padding bits) before
//! anything is written, so a failed decompress leaves `out`/`acc` untouched.
//!
//! # Speed and threads
//! The hot loops are written over fixed-size groups so that they vectorise, and compiled three
//! times (baseline, AVX2, AVX-512; the widest the CPU has is picked at run time, [`SimdLevel`],
//! and all give the same bits). Long chunks are split across rayon's *current*
//! pool at fixed offsets with fixed-order combination, so the bytes never depend on the thread
//! count; run inside `ThreadPool::install` to bound the threads. See [`bench`](mod@bench) and the crate
//! README for measured throughput.

pub mod bench;
pub mod chain;
pub mod chunk;
pub mod codec;
mod codecs;
pub mod elem;
pub mod error;
pub mod gossip;
mod par;
pub mod params;
pub mod payload;
pub mod reduce;
pub mod registry;
pub mod rng;
mod simd;
pub mod spec;
mod stats;

pub use chain::Compressor;
pub use chunk::{
    chunk_codec, fp32_codec, CodecContext, CodecFactory, Fp32Factory, KernelsFactory, Node,
};
pub use codec::{Codec, CodecInfo, NodeIdentity, RoundCtx};
pub use error::{KernelError, Result};
pub use params::{
    Cast, CompressorSpec, DitheringSpec, EfKind, EliasCode, Encoding, Exchange, MinMaxSpec,
    MoniquaSpec, Normalize, OneBitColumnsSpec, OneBitSpec, Partition, PowerSgd, PowerSgdLayout,
    PowerSgdMatrices, PowerSgdPart, PowerSgdPiece, PowerSgdPlan, PowerSgdShape, PowerSgdSpec,
    PowerSgdState, RandomKSpec, Rounding, ThetaSchedule, TopKSpec, KEYS,
};
pub use pushpull_proto::checkpoint::ChainState;
pub use reduce::{average, host_fold, IntraCodec, RankOrderSum};
pub use registry::{
    all_keys, build_compressor, build_from_spec, is_gossip, overlay_params, parse_params,
    COMPRESSORS,
};
pub use rng::Role;
pub use simd::{set_max_simd_level, simd_level, stream_bytes, SimdLevel};
pub use spec::{BuildOptions, CodecSpec, Entry, KSpec, KeyInfo, Keys, Kind, Purpose};
