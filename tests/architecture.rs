//! ARCHITECTURE.md stays true: its block of figures (crate sizes, the largest files, the crate
//! graph, which crates pull in tokio, quinn, cudarc, candle, ...) is what
//! `scripts/architecture-facts.py` prints today, and every path it names exists. The script
//! does the work (`--check`); this test makes `cargo test`, and so `scripts/test.sh` and CI,
//! run it. When it fails, `scripts/architecture-facts.py --write` rewrites the block.

use std::path::Path;
use std::process::Command;

#[test]
fn architecture_facts_are_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("scripts/architecture-facts.py");
    // The script calls `cargo metadata` and `cargo tree` (offline, building nothing) with the
    // cargo that runs this test.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let out = Command::new("python3")
        .arg(&script)
        .arg("--check")
        .current_dir(root)
        .env("CARGO", cargo)
        .output()
        .unwrap_or_else(|e| panic!("running python3 {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/architecture-facts.py --check failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}
