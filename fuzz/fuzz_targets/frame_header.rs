//! `FrameHeader::decode` over arbitrary bytes: no panic; an accepted header encodes back to the
//! bytes it was read from (but the reserved bytes 6..8, which decode ignores).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushpull_proto::protocol::{FrameHeader, FRAME_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    for max in [0, 1 << 20, u64::MAX] {
        if let Ok(h) = FrameHeader::decode(data, max) {
            assert!(h.payload_len <= max);
            let mut back = h.to_bytes().to_vec();
            back[6..8].copy_from_slice(&data[6..8]);
            assert_eq!(back, &data[..FRAME_HEADER_LEN]);
        }
    }
});
