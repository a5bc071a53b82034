//! `decode_control` of both message types over arbitrary bodies: no panic, no allocation beyond
//! libFuzzer's limit; an accepted message encodes to a frame that decodes back to it; a refusal
//! names the message type.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushpull_proto::protocol::{decode_control, encode_control, FromScheduler, ToScheduler};

macro_rules! check {
    ($t:ty, $data:expr) => {
        match decode_control::<$t>($data) {
            Ok(m) => {
                let frame = encode_control(&m).unwrap();
                assert_eq!(decode_control::<$t>(&frame[4..]).unwrap(), m);
            }
            Err(e) => {
                let want = concat!("malformed control message: ", stringify!($t), ": ");
                assert!(e.to_string().starts_with(want), "{e}");
            }
        }
    };
}

fuzz_target!(|data: &[u8]| {
    check!(ToScheduler, data);
    check!(FromScheduler, data);
});
