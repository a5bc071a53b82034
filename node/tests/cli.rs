//! The `pushpull-scheduler` and `pushpull-server` binaries themselves (the root package's tests
//! run the same code as `pushpull scheduler|server`, with whole clusters): their flags, and bad
//! input named with exit code 2 before anything binds.

use std::process::Command;

const SCHEDULER: &str = env!("CARGO_BIN_EXE_pushpull-scheduler");
const SERVER: &str = env!("CARGO_BIN_EXE_pushpull-server");

/// Runs `program` with `args`: (exit code, stdout, stderr).
fn run(program: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_lists_the_flags() {
    for (program, flags) in [
        (
            SCHEDULER,
            &["--config", "--scheduler", "--ca", "--cert", "--key"][..],
        ),
        (
            SERVER,
            &[
                "--config",
                "--scheduler",
                "--ca",
                "--cert",
                "--key",
                "--listen",
            ][..],
        ),
    ] {
        let (code, out, err) = run(program, &["--help"]);
        assert_eq!(code, Some(0), "{program}: {err}");
        for f in flags {
            assert!(out.contains(f), "{program} --help lacks {f}:\n{out}");
        }
    }
}

#[test]
fn bad_input_is_named_with_exit_code_2() {
    let dir = std::env::temp_dir().join(format!("pushpull-node-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let typo = dir.join("typo.toml");
    std::fs::write(&typo, "[cluster]\nnum_wrokers = 2\n").unwrap();
    let typo = typo.display().to_string();
    for program in [SCHEDULER, SERVER] {
        let (code, _, err) = run(program, &["--config", "/nonexistent/cluster.toml"]);
        assert_eq!(code, Some(2), "{program}: {err}");
        assert!(
            err.contains("/nonexistent/cluster.toml"),
            "{program}: {err}"
        );

        let (code, _, err) = run(program, &["--config", &typo]);
        assert_eq!(code, Some(2), "{program}: {err}");
        assert!(
            err.contains("num_wrokers") && err.contains(&typo),
            "{program} names the key and the file: {err}"
        );

        let (code, _, err) = run(program, &["--config", &typo, "--bogus"]);
        assert_eq!(code, Some(2), "{program}: {err}");
        assert!(err.contains("--bogus"), "{program}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
