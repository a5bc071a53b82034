//! The example cluster files in `configs/` parse and validate.

use super::*;

#[test]
fn shipped_examples_parse() {
    for (name, text) in [
        (
            "configs/local.toml",
            include_str!("../../../configs/local.toml"),
        ),
        (
            "configs/gpu-local.toml",
            include_str!("../../../configs/gpu-local.toml"),
        ),
        (
            "configs/multi-host.toml",
            include_str!("../../../configs/multi-host.toml"),
        ),
    ] {
        let c = Config::from_toml_str(text, name).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.cluster.num_workers >= 1, "{name}");
    }
}
