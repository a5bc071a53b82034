//! `pushpull`: the launcher (`pushpull local`) and tools; see `pushpull --help` and
//! [`pushpull::cli`].

fn main() -> std::process::ExitCode {
    pushpull::cli::pushpull_main()
}
