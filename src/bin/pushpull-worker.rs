//! `pushpull-worker`: see `pushpull-worker --help` and [`pushpull::cli`].

fn main() -> std::process::ExitCode {
    pushpull::cli::worker_main()
}
