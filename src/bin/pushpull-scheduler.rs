//! `pushpull-scheduler`: see `pushpull-scheduler --help` and [`pushpull::cli`].

fn main() -> std::process::ExitCode {
    pushpull::cli::scheduler_main()
}
