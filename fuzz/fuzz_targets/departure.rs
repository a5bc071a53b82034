//! `Departure::from_close` over an arbitrary code (the first byte, or 8 bytes when it is 255)
//! and reason: no panic; the departure is the one the code names, a `NodeLost` reading back as
//! itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushpull_proto::departure::Departure;

fuzz_target!(|data: &[u8]| {
    let (code, reason) = match data {
        [255, c @ ..] if c.len() >= 8 => (u64::from_le_bytes(c[..8].try_into().unwrap()), &c[8..]),
        [c, rest @ ..] => (u64::from(*c % 6), rest),
        [] => return,
    };
    let d = Departure::from_close(code, reason);
    let text = String::from_utf8_lossy(reason).into_owned();
    match (code, &d) {
        (0, Departure::Done(t)) | (1, Departure::Refused(t)) | (4, Departure::JobFailed(t)) => {
            assert_eq!(*t, text)
        }
        (3, Departure::NodeLost { .. }) => assert_eq!(Departure::from_close(3, &d.reason()), d),
        (0 | 1 | 4, _) => panic!("code {code} read as {d:?}"),
        (_, Departure::Failed(t)) => assert_eq!(*t, text),
        _ => panic!("code {code} read as {d:?}"),
    }
});
